"""The `trainyard` command line (api/cli/commands.py); `python -m api.cli` runs it too."""

from api.cli.commands import app, main

__all__ = ["app", "main"]
