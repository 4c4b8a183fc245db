"""Following jobs live over REST: state, step/total, loss, samples/s and ETA per job, plus new events."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from api.cli.client import Client

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def _short(message: str, limit: int = 140) -> str:
    message = " ".join(message.split())
    return message if len(message) <= limit else message[: limit - 1] + "…"


def _eta(job: dict) -> str:
    eta = job.get("eta_s")
    if job["state"] in TERMINAL:
        return "done"
    if eta is None:
        return "-"
    return f"{int(eta // 60)}:{int(eta % 60):02d}"


def follow_jobs(client: Client, job_ids: list[str], console: Console, poll_s: float = 0.5,
                timeout_s: float = 3600.0) -> dict[str, dict]:
    """Poll until every job ends; print lifecycle events as they land. Returns the final jobs."""
    progress = Progress(
        TextColumn("[bold]{task.description:<18}"), TextColumn("{task.fields[state]:<10}"), BarColumn(),
        MofNCompleteColumn(), TextColumn("loss {task.fields[loss]:>7}"),
        TextColumn("{task.fields[rate]:>8} samples/s"), TextColumn("ETA {task.fields[eta]}"),
        console=console, transient=False,
    )
    last_event = {job_id: 0 for job_id in job_ids}
    jobs: dict[str, dict] = {}
    tasks = {}
    deadline = time.monotonic() + timeout_s
    with progress:
        while True:
            for job_id in job_ids:
                job = jobs[job_id] = client.job(job_id)
                if job_id not in tasks:
                    tasks[job_id] = progress.add_task(f"{job['name']} {job_id[:6]}", total=job["total_steps"] or None,
                                                      state="", loss="-", rate="-", eta="-")
                for event in client.events(job_id, after=last_event[job_id]):
                    last_event[job_id] = event["id"]
                    if event["kind"] not in ("checkpoint",):
                        progress.console.log(f"{job['name']} {job_id[:6]}: {event['kind']} {event['state'] or ''} "
                                             f"{_short(event['message'])}")
                rate = job.get("samples_per_s")
                phase = (job.get("phase") or {}).get("message")  # `evaluating (final validation) 1,200/3,125 batches`
                progress.update(tasks[job_id], completed=job["step"],
                                state=f"{job['state']}: {phase}" if phase else job["state"],
                                loss=f"{job['loss']:.4f}" if job.get("loss") is not None else "-",
                                rate=f"{rate:,.0f}" if rate else "-", eta=_eta(job))
            if all(j["state"] in TERMINAL for j in jobs.values()) or time.monotonic() > deadline:
                return jobs
            time.sleep(poll_s)
