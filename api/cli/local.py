"""`trainyard run | schema | validate | plan`: the commands that need no server."""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from api.cli.output import err
from api.cli.spec_input import read_spec_data_or_exit, read_spec_or_exit, refuse_if_too_big
from workers.spec import CODE_REF_PREFIX, JobSpec
from workers.storage import Storage


def with_absolute_working_dir(spec: JobSpec, spec_dir: Path) -> JobSpec:
    """`trainyard run` uses a local program.working_dir in place: a relative one is taken from the spec
    file's directory (as `trainyard submit` does), not from wherever the workers start."""
    program = spec.program
    if program is None or program.working_dir is None or program.working_dir.startswith(CODE_REF_PREFIX):
        return spec
    path = Path(program.working_dir).expanduser()
    absolute = str(path if path.is_absolute() else (spec_dir / path).absolute())
    if absolute == program.working_dir:
        return spec
    return spec.model_copy(update={"program": program.model_copy(update={"working_dir": absolute})})


def run(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC", help="YAML or JSON job spec")],
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON summary object")] = False,
    warm_workers: Annotated[int, typer.Option(
        "--warm-workers", min=0,
        help="keep this many rank workers with torch imported in a warm pool, so that "
             "restarts (and the start, once they are ready) skip the cold start; 0: none")] = 0,
) -> None:
    """Train SPEC directly on a local Ray (or TRAINYARD_RAY_ADDRESS), without the server."""
    from service.ray_client import connect
    from service.settings import get_settings

    settings = get_settings()
    spec = with_absolute_working_dir(read_spec_or_exit(spec_path, allow_fault_injection=settings.allow_fault_injection),
                                     spec_path.parent)
    refuse_if_too_big(spec, on_this_host=not settings.ray_address)
    job_id = f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    connect(settings)
    pool = _start_warm_pool(warm_workers)
    job_dir = settings.job_storage(job_id)
    try:
        summary = _run_job(spec, job_dir, job_id, as_json)
    finally:
        if pool is not None:  # a pool this command started; a cluster's own pool stays
            _stop_warm_pool(pool)
        if not settings.ray_address:  # the local Ray this command started, every process of it
            from service.ray_client import stop_local_ray

            stop_local_ray()
    # stderr under --json, so that stdout stays one JSON object
    (err if as_json else Console()).print(f"results: {results_location(job_dir)}", highlight=False, soft_wrap=True)
    raise typer.Exit(0 if summary["state"] == "SUCCEEDED" else 1)


def results_location(job_dir: Storage) -> str:
    """The job directory as a user types it: `./.trainyard/storage/jobs/<id>/` under the current directory,
    else its absolute path or URI, with a trailing slash (it is a directory)."""
    if job_dir.is_local:
        path = Path(job_dir.uri)
        try:
            return f"./{path.relative_to(Path.cwd())}/"
        except ValueError:
            return f"{path}/"
    return f"{job_dir.uri}/"


def _start_warm_pool(size: int):
    """The pool of pre-imported rank workers for `run --warm-workers`, if this command creates it."""
    from workers.runtime.pool import find_pool, start_pool

    if size <= 0 or find_pool() is not None:
        return None
    return start_pool(size)


def _stop_warm_pool(pool) -> None:
    import ray

    try:
        ray.get(pool.shutdown.remote(), timeout=30)
        ray.kill(pool)
    except Exception:  # the local Ray is going away anyway
        pass


def _run_job(spec: JobSpec, job_dir: Storage, job_id: str, as_json: bool) -> dict:
    from service.supervisor.run import JobRun

    if as_json:
        summary = JobRun(spec, job_dir, job_id).run()
        print(json.dumps(summary))
        return summary
    from api.cli.progress import RunProgress

    console = Console()
    with RunProgress(spec.total_steps, console) as progress:
        summary = JobRun(spec, job_dir, job_id, listener=progress).run()
    print_summary(console, summary)
    return summary


def print_summary(console: Console, summary: dict) -> None:
    table = Table(title=f"{summary['name']} ({summary['job_id']})", show_header=False)
    for key, value in summary.items():
        if key in {"name", "job_id"}:
            continue
        if isinstance(value, float):
            value = f"{value:.6g}"
        table.add_row(key, json.dumps(value) if isinstance(value, dict) else str(value))
    console.print(table)


def schema() -> None:
    """Print the JobSpec JSON Schema."""
    print(json.dumps(JobSpec.model_json_schema(), indent=2))


def validate(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC", help="YAML or JSON job spec")],
    as_json: Annotated[bool, typer.Option("--json", help="print the resolved spec (defaults filled in, "
                                                         "parallel: auto resolved) as JSON instead")] = False,
) -> None:
    """Check SPEC against every rule, and its predicted peak memory per worker against
    resources.memory_per_worker_gib (without one, this host's memory). Valid: one line with the layout,
    the workers and the predicted peak per worker; invalid: a line per problem on stderr, exit 2."""
    from api.cli.verdict import verdict
    from service.settings import get_settings

    spec = read_spec_or_exit(spec_path, allow_fault_injection=get_settings().allow_fault_injection)
    refuse_if_too_big(spec, on_this_host=spec.resources.memory_per_worker_gib is None)
    print(json.dumps(spec.model_dump(mode="json"), indent=2) if as_json else verdict(spec, spec_path))


def plan(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC",
                                              help="YAML or JSON job spec; its parallel block is ignored")],
    memory_gib: Annotated[float | None, typer.Option("--memory-gib", help="per-worker memory budget "
                                                     "(default: resources.memory_per_worker_gib)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the plan as one JSON object")] = False,
) -> None:
    """Dry-run the layout planner: every layout of SPEC's workers the strategies run, pipelines included, with
    its predicted bytes and step cost, the one `parallel: auto` chooses (*), and those left out and why."""
    data = read_spec_data_or_exit(spec_path)  # before the planner's torch import: a typo is answered at once
    from workers.parallel.planner import GIB
    from workers.parallel.planner import plan as make_plan

    try:
        result = make_plan(data, memory_budget_gib=memory_gib)
    except ValueError as exc:  # a SpecError or ValidationError too
        typer.echo(f"{spec_path}: {exc}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        print(json.dumps(result.to_dict()))
        raise typer.Exit(0 if result.chosen else 1)
    from api.cli.plan_table import layout_table, left_out

    console = Console()
    console.print(layout_table(result, f"layouts for {spec_path.name}"))
    for line in left_out(result):
        console.print(line)
    if result.memory_budget_bytes:
        console.print(f"budget: {result.memory_budget_bytes / GIB:.3g} GiB per worker")
    console.print(f"choice: {result.explanation}")
    raise typer.Exit(0 if result.chosen else 1)


def register_local(app: typer.Typer) -> None:
    for command in (run, schema, validate, plan):
        app.command()(command)
