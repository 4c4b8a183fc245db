import sys

from api.cli.commands import main

sys.exit(main())
