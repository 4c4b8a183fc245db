"""`trainyard serve | submit | list | get | cancel | events | logs`: the service side of the CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Column, Table

from api.cli.client import ApiFailure, Client
from api.cli.follow import TERMINAL, follow_jobs
from api.cli.output import err, fail, out, steps_of
from api.cli.spec_input import read_spec_data_or_exit


def _num(value, fmt=".4g") -> str:
    return "-" if value is None else format(value, fmt)


def serve(
    host: Annotated[str | None, typer.Option(help="bind address (default TRAINYARD_HOST, 127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option(help="port (default TRAINYARD_PORT, 8600)")] = None,
    workers: Annotated[int | None, typer.Option(min=1, help="processes answering the API (default "
                                                            "TRAINYARD_API_WORKERS, 1); about one per core")] = None,
) -> None:
    """Run the control plane (REST API, scheduler, reconciler) in the foreground."""
    import logging
    import os

    # Ray's driver installs a C++ failure-signal handler that takes SIGTERM too and ends the process
    # 3 s later by an alarm, so a stopping service was killed mid-shutdown (lease held, its local Ray
    # orphaned). The service handles SIGTERM itself; rank workers keep Ray's handler (worker_env).
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")

    from api.cli.processes import LOG_FORMAT, run_uvicorn, serve_processes, uvicorn_options
    from api.http.app import create_app
    from service.settings import InvalidSettings, get_settings
    from service.storage_check import storage_problem

    settings = get_settings()  # invalid: api/cli/commands.py main() says which variable and exits 2
    if problem := storage_problem(settings.storage):  # before anything is created or accepted
        raise InvalidSettings([f"TRAINYARD_STORAGE_URI: {problem}"])
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    host, port, workers = host or settings.host, port or settings.port, workers or settings.api_workers
    if workers > 1:
        serve_processes(settings, host, port, workers)
    else:
        run_uvicorn(create_app(settings), uvicorn_options(settings), settings.request_read_timeout_s,
                    host=host, port=port)


def submit(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC", help="YAML or JSON job spec")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="show live progress until the job ends")] = False,
    priority: Annotated[int, typer.Option(help="higher starts first")] = 0,
    idempotency_key: Annotated[str | None,
                               typer.Option(help="resubmitting with the same key returns the same job")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the job as JSON")] = False,
) -> None:
    """Submit SPEC to the service (TRAINYARD_URL). A local program.working_dir (a relative one is taken
    from SPEC's directory) is zipped and uploaded first; the job's spec names the upload."""
    data = read_spec_data_or_exit(spec_path)  # a file that is no spec goes no further than this machine
    client = Client()
    try:
        data = _with_uploaded_code(client, data, spec_path)
        job = client.submit(data, priority=priority, idempotency_key=idempotency_key)
        if as_json and not follow:
            print(json.dumps(job))
            return
        out.print(f"submitted [bold]{job['name']}[/bold] as job [cyan]{job['id']}[/cyan] ({job['state']})")
        if follow:
            job = follow_jobs(client, [job["id"]], out)[job["id"]]
            print_job(job) if not as_json else print(json.dumps(job))
            if job["state"] != "SUCCEEDED":
                raise typer.Exit(1)
    except ApiFailure as exc:
        raise fail(exc)


def _with_uploaded_code(client: Client, data: dict, spec_path: Path) -> dict:
    """The spec with its local program.working_dir replaced by the code reference of its upload.
    An absolute path that is no directory here is left as it is: a path on the service's storage."""
    from api.cli.code_upload import WorkingDirError, local_working_dir, upload, with_working_dir
    from service.settings import get_settings

    local = local_working_dir(data, spec_path.parent)
    if local is None or (not local.exists() and Path(data["program"]["working_dir"]).expanduser().is_absolute()):
        return data
    try:
        uploaded = upload(client, local, get_settings().max_code_bytes)
    except WorkingDirError as exc:
        err.print(f"[red]cannot upload the working_dir[/red] {exc}")
        raise typer.Exit(2) from None
    verb = "uploaded" if uploaded["created"] else "already uploaded:"
    err.print(f"{verb} {local} as {uploaded['ref']} ({uploaded['bytes']} bytes)")
    return with_working_dir(data, uploaded["ref"])


def list_jobs(
    state: Annotated[str | None, typer.Option(help="only jobs in this state")] = None,
    limit: Annotated[int, typer.Option(help="at most this many, newest first")] = 50,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """List your jobs, newest first."""
    try:
        jobs = Client().jobs(state, limit)
    except ApiFailure as exc:
        raise fail(exc)
    if as_json:
        print(json.dumps(jobs))
        return
    table = Table("NAME", "STATE", "STEP", "LOSS", "SAMPLES/S", "RESTARTS", "CREATED")
    table.columns.insert(0, Column("ID", no_wrap=True, min_width=16))
    for c in table.columns[2:4]:
        c.no_wrap = True
    for j in jobs:
        table.add_row(j["id"], j["name"], j["state"], steps_of(j), _num(j["loss"]),
                      _num(j["samples_per_s"], ",.0f"), str(j["restarts"]),
                      (j["created_at"] or "")[5:16].replace("T", " "))
    out.print(table)


def print_job(job: dict) -> None:
    table = Table(title=f"{job['name']} ({job['id']})", show_header=False)
    skip = {"spec", "summary", "id", "name"}
    for key, value in job.items():
        if key == "phase" and value is not None:  # its message: `uploading checkpoint (step 40) 40% of 12.0 MB`
            table.add_row(key, value["message"])
        elif key not in skip and value is not None:
            table.add_row(key, json.dumps(value) if isinstance(value, (dict, list)) else str(value))
    for key in ("initial_loss", "final_loss", "params_sha256", "export_path"):
        if (job.get("summary") or {}).get(key) is not None:
            table.add_row(key, str(job["summary"][key]))
    out.print(table)


def get(job_id: Annotated[str, typer.Argument(metavar="ID")],
        as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Show one job."""
    try:
        job = Client().job(job_id)
    except ApiFailure as exc:
        raise fail(exc)
    print(json.dumps(job)) if as_json else print_job(job)


def cancel(job_id: Annotated[str, typer.Argument(metavar="ID")],
           wait: Annotated[bool, typer.Option(help="wait until the job has stopped")] = True) -> None:
    """Cancel a job (queued: at once; running: its workers are stopped and released)."""
    import time

    client = Client()
    try:
        job = client.cancel(job_id)
        while wait and job["state"] not in TERMINAL:
            time.sleep(0.5)
            job = client.job(job_id)
    except ApiFailure as exc:
        raise fail(exc)
    out.print(f"job {job_id}: {job['state']}{' (cancel requested)' if job['state'] not in TERMINAL else ''}")


def events(job_id: Annotated[str, typer.Argument(metavar="ID")],
           as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """A job's lifecycle: state changes, restarts, checkpoints."""
    try:
        rows = Client().events(job_id)
    except ApiFailure as exc:
        raise fail(exc)
    if as_json:
        print(json.dumps(rows))
        return
    table = Table("TIME", "KIND", "STATE", "MESSAGE")
    for e in rows:
        table.add_row((e["ts"] or "")[11:23], e["kind"], e["state"] or "", e["message"])
    out.print(table)


def logs(job_id: Annotated[str, typer.Argument(metavar="ID")],
         rank: Annotated[str, typer.Option(help="a rank number or 'supervisor'")] = "0",
         tail: Annotated[int, typer.Option(help="last N lines")] = 200,
         follow: Annotated[bool, typer.Option("--follow", "-f", help="stream until the job ends")] = False) -> None:
    """Print a rank's log (or the supervisor's)."""
    client = Client()
    try:
        if follow:
            for chunk in client.follow_logs(job_id, rank, tail):
                sys.stdout.write(chunk)
                sys.stdout.flush()
        else:
            sys.stdout.write(client.logs(job_id, rank, tail))
    except ApiFailure as exc:
        raise fail(exc)


def register_remote(app: typer.Typer) -> None:
    app.command()(serve)
    app.command()(submit)
    app.command("list")(list_jobs)
    app.command()(get)
    app.command()(cancel)
    app.command()(events)
    app.command()(logs)
