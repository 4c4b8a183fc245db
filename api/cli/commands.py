"""The `trainyard` command line: one Typer app with the local, the service and the admin commands."""

from __future__ import annotations

import sys

import typer

from api.cli.admin import register_admin
from api.cli.local import register_local
from api.cli.output import err
from api.cli.remote import register_remote

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Trainyard: distributed training jobs on Ray.")
register_local(app)  # run, schema, validate, plan
register_remote(app)  # serve, submit, list, get, cancel, events, logs
register_admin(app)  # tenant-*, token-*, audit


def main() -> None:  # pragma: no cover
    from service.settings import InvalidSettings

    try:
        app()
    except InvalidSettings as exc:  # from any command: serve, run, or a client command's token lookup
        for line in exc.lines:
            err.print(f"[red]invalid setting[/red] {line}", soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
