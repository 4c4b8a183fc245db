"""The fleet simulator: the real service (HTTP, PostgreSQL, scheduler, reconciler, admission, metrics,
supervisors' loop and policies) on a simulated cluster of 1,000 nodes, with 10,000 queued jobs
from 20 teams, ~500 running, one 4,096-rank job and steady API load.

    .venv/bin/python -m bench.fleet [--minutes 3] [--json OUT]

What is simulated, and only that: the cluster behind the service's cluster port (nodes, resources,
placement groups created at a fixed rate, node loss; bench/fleet/nodes.py) and the ranks, which
report one step per second per job through the supervisors' own aggregation (bench/fleet/ranks.py).
Prints a table and writes the contract's keys (docs/scale.md) with --json.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import statistics
import tempfile
import time
from datetime import UTC, datetime
from math import inf
from multiprocessing.connection import Client
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from bench.api_load import _load, http_request
from bench.fleet.admission import SAMPLE_S, fitted, spoken_for
from bench.fleet.figures import FleetDatabase
from bench.fleet.load import steady_load
from bench.fleet.pass_time import cpu_shares, pass_parts, slowest_passes
from bench.fleet.processes import fleet_service
from bench.fleet.workload import JobPlan, queued_jobs, spec, tenants
from tests.live import create_pg_schema, drop_pg_schema, pg_schema_url
from workers.runtime.group_owner import GroupOwner

console = Console(width=160)


def p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


class ClusterLink:
    """The simulator's own connection to the cluster process (node losses, supervisor figures)."""

    def __init__(self, address, authkey: bytes):
        self.conn = Client(address, authkey=authkey)

    def __call__(self, op: str, *args):
        self.conn.send((op, args))
        ok, value = self.conn.recv()
        if not ok:
            raise RuntimeError(value)
        return value


def create_tenants(url: str, admin: str, plans) -> dict[str, tuple[str, str]]:
    """name -> (tenant id, token). A service without tenant weights (today's) gets the tenants without."""
    out, weights = {}, True
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin}"}, timeout=30) as http:
        for plan in plans:
            body: dict = {"name": plan.name, "max_workers": plan.max_workers, "quota_mode": "queue"}
            r = http.post("/v1/tenants", json={**body, "weight": plan.weight} if weights else body)
            if r.status_code == 422 and "weight" in r.text:
                weights = False
                r = http.post("/v1/tenants", json=body)
            r.raise_for_status()
            out[plan.name] = (r.json()["id"], r.json()["token"])
    if not weights:
        console.print("[yellow]this service has no tenant weights: every tenant weighs the same[/yellow]")
    return out


def submit_all(port: int, jobs: list[JobPlan], tokens: dict[str, tuple[str, str]], checkpoint_every: int) -> list[str]:
    requests = [http_request("POST", f"/v1/jobs?priority={j.priority}", tokens[j.tenant][1],
                             json.dumps(spec(f"fleet-{i}", j.workers, j.steps, checkpoint_every)).encode())
                for i, j in enumerate(jobs)]
    _, responses, seconds = asyncio.run(_load([port], requests, 16))
    bad = [(status, body[:200]) for status, body in responses if status != 201]
    if bad:
        raise RuntimeError(f"{len(bad)} of {len(jobs)} submits refused, e.g. {bad[0]}")
    console.print(f"submitted {len(jobs)} jobs over HTTP in {seconds:.1f}s")
    return [json.loads(body)["id"] for _, body in responses]


def submit_big(url: str, token: str, ranks: int, steps: int, checkpoint_every: int) -> str:
    body = spec("big-job", ranks, steps, checkpoint_every)
    r = httpx.post(f"{url}/v1/jobs?priority=10", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=60)
    r.raise_for_status()
    return r.json()["id"]


def scrape(url: str) -> tuple[int, float]:
    t0 = time.perf_counter()
    r = httpx.get(f"{url}/metrics", timeout=60)
    seconds = time.perf_counter() - t0
    return sum(1 for line in r.text.splitlines() if line and not line.startswith("#")), seconds


def control_passes(stats: Path, since: float, parallel_answers: bool = True
                   ) -> tuple[float | None, dict[str, float | None]]:
    """The control pass's p99: on one thread (today's loop) a reconcile and the schedule after it
    are one pass; on threads of their own, each loop's pass is the worse of the two. A pass still
    running when the window ended counts with the time it had taken so far (a lower bound).
    `parallel_answers`: each pass less the time the cluster process spent answering its gathers one
    after another beyond the slowest answer (serve.py `timed`), as Ray's actors answer in parallel."""
    stats_now = json.loads(stats.read_text())
    unfinished = [(loop, thread, started, stats_now["now"] - started, 0.0)
                  for thread, (loop, started) in stats_now["in_flight"].items()]
    passes = [(loop, thread, started, seconds - (serial if parallel_answers else 0.0))
              for loop, thread, started, seconds, *rest in stats_now["passes"] + unfinished
              for serial in [rest[0] if rest else 0.0] if started + seconds >= since]
    by_loop = {loop: p99([p[3] for p in passes if p[0] == loop]) for loop in ("reconcile", "schedule")}
    threads = {loop: {p[1] for p in passes if p[0] == loop} for loop in ("reconcile", "schedule")}
    if threads["reconcile"] & threads["schedule"]:  # one thread runs both: sum each reconcile with its schedule
        ordered = sorted(passes, key=lambda p: p[2])
        joint, current = [], None
        for loop, _, _, seconds in ordered:
            if loop == "reconcile":
                if current is not None:
                    joint.append(current)
                current = seconds
            elif current is not None:
                current += seconds
        return p99(joint), by_loop
    worst = [v for v in by_loop.values() if v is not None]
    return (max(worst) if worst else None), by_loop


def growth_per_step(states: list[dict]) -> float | None:
    """The supervisor's growth in bytes per step from its deep sizes, sampled every 30 s after warm-up
    (a deep size of a 4,096-rank supervisor holds the cluster process a second or more: every 10 s, it
    slowed every pass): the median of the slopes between every two samples (Theil-Sen), so a transient
    (a 4,096-rank step half joined when one sample is taken: about 1 MiB) does not pass for growth, as
    it did between two samples only."""
    slopes = [(b["bytes"] - a["bytes"]) / (b["step"] - a["step"])
              for i, a in enumerate(states) for b in states[i + 1:] if b["step"] > a["step"]]
    return statistics.median(slopes) if slopes else None


def run(args) -> dict:
    work = Path(tempfile.mkdtemp(prefix="fleet-"))
    schema = create_pg_schema()
    db = FleetDatabase(pg_schema_url(schema))
    cluster_args = ["--nodes", str(args.nodes), "--gpus-per-node", str(args.gpus_per_node),
                    "--groups-per-s", str(args.groups_per_s), "--step-s", str(args.step_s)]
    settings = {"TRAINYARD_RESERVE_AFTER_S": str(args.reserve_after_s), "TRAINYARD_API_WORKERS": str(args.api_workers)}
    try:
        with fleet_service(work, pg_schema_url(schema), cluster_args, settings, args.cluster_nice) as service:
            link = ClusterLink(service.cluster_address, service.authkey)
            plans = tenants(args.tenants)
            tokens = create_tenants(service.url, service.admin_token, plans)
            jobs = queued_jobs(plans, args.queued, args.seed, args.min_steps, args.max_steps)
            ids = submit_all(service.port, jobs, tokens, args.checkpoint_every)
            settle_until = time.monotonic() + args.settle_s
            while time.monotonic() < settle_until and db.states().get("RUNNING", 0) < args.running:
                time.sleep(2)
            states = db.states()
            console.print(f"before the window: {states}")
            queued_tenants = db.tenants_with_queued()
            window_start_wall = datetime.now(UTC)
            window_start = time.monotonic()
            threads_before = json.loads(service.stats.read_text()).get("thread_cpu", {})
            big = submit_big(service.url, tokens[plans[-2].name][1], args.big_job_ranks, args.big_steps,
                             args.checkpoint_every)
            probe = plans[-1].name

            readers = [(job_id, tokens[j.tenant][1]) for job_id, j in zip(ids, jobs)]

            probes = itertools.count()

            def probe_spec(n: int) -> dict:
                # Every other probe is a CPU job: on a fleet whose GPUs are all held (running jobs and the
                # reservations), a 1-GPU probe rarely fits; a CPU job does, and is admitted by the same path.
                return spec(f"probe-{n}", 1, 60, args.checkpoint_every, gpus_per_worker=next(probes) % 2)

            async def window():
                return await asyncio.gather(
                    steady_load(service.port, tokens[probe][1], readers, args.minutes * 60, args.reads_per_s,
                                args.submits_per_s, probe_spec),
                    asyncio.to_thread(observe), asyncio.to_thread(sample_free))

            def sample_free():  # on a connection of its own: the observer's calls take longer than a sample
                own = ClusterLink(service.cluster_address, service.authkey)
                end = window_start + args.minutes * 60
                while time.monotonic() < end:
                    forming = db.forming()
                    created = {(o.job_id, o.epoch) for g in own("groups").values() if g["state"] == "CREATED"
                               if (o := GroupOwner.of_group(g["name"])) is not None}
                    available, now = own("available"), time.time()
                    for key, column, resource in (("free", 2, "GPU"), ("free_cpu", 3, "CPU")):
                        held = spoken_for([(f[0], f[1], f[column]) for f in forming], created)
                        samples[key].append((now, available.get(resource, 0.0) - held))
                    time.sleep(SAMPLE_S)
                own.conn.close()

            samples: dict[str, list] = {"running": [], "series": [], "scrape_s": [], "free": [], "free_cpu": []}
            big_warm: list[dict] = []  # the big job's supervisor once warmed up (10 steps in)

            def observe():
                end = window_start + args.minutes * 60
                losses = [window_start + (i + 0.5) * (end - window_start) / max(1, args.node_losses)
                          for i in range(args.node_losses)]
                next_scrape = window_start + 5
                next_state = window_start  # the big job's supervisor's deep size: every 30 s once warm
                while time.monotonic() < end:
                    now = time.monotonic()
                    if losses and now >= losses[0]:
                        losses.pop(0)
                        link("lose_node")
                    samples["running"].append(db.states().get("RUNNING", 0))
                    if now >= next_scrape:
                        n, s = scrape(service.url)
                        samples["series"].append(n)
                        samples["scrape_s"].append(s)
                        next_scrape = now + 20
                    if now >= next_state and (big_warm or ((step := link("supervisor_step", big)) is not None
                                                            and step >= 10)):
                        if (state := link("supervisor_state", big)) is not None:
                            big_warm.append(state)
                        next_state = now + (30 if big_warm else 0)
                    time.sleep(2)

            timings, _, _ = asyncio.run(window())
            window_end_wall = datetime.now(UTC)
            threads_after = json.loads(service.stats.read_text()).get("thread_cpu", {})
            time.sleep(args.admission_grace_s)  # a probe sent in the window's last moments may still be admitted
            cluster_stats = link("stats")
            passes_p99, by_loop = control_passes(service.stats, window_start)
            raw_p99, raw_by_loop = control_passes(service.stats, window_start, parallel_answers=False)
            all_passes = json.loads(service.stats.read_text())["passes"]
            split = pass_parts(all_passes, window_start, p99)
            n_series, scrape_s = scrape(service.url)
            samples["series"].append(n_series)
            samples["scrape_s"].append(scrape_s)
            big_state, big_submitted, big_admitted, big_running = db.job(big)
            waited_until = big_admitted or window_end_wall
            latencies = db.admission_latencies([i for i, _ in timings.submitted])
            # The probes that fitted (bench/fleet/admission.py); one never admitted counts as waiting for ever.
            reservations = db.reservations()
            cpu_reservations = db.reservations("cpus")
            gpu_fits = [(job_id, at) for job_id, at in timings.submitted if job_id in timings.gpu_jobs
                        if fitted(samples["free"], at, reservations)]
            cpu_fits = [(job_id, at) for job_id, at in timings.submitted if job_id not in timings.gpu_jobs
                        if fitted(samples["free_cpu"], at, cpu_reservations)]
            fits = gpu_fits + cpu_fits
            fitting = [inf if (lat := latencies.get(job_id)) is None else lat for job_id, _ in fits]
            slowest = sorted(fits, key=lambda f: -(latencies.get(f[0]) or inf))[:3]
            last = link("supervisor_state", big)
            bytes_per_step = growth_per_step(big_warm + ([last] if last is not None else []))
            result = {
                "nodes": args.nodes, "gpus": args.nodes * args.gpus_per_node, "tenants": args.tenants,
                "queued": states.get("QUEUED", 0), "running": round(statistics.fmean(samples["running"]))
                if samples["running"] else 0, "running_min": min(samples["running"], default=0),
                "big_job_ranks": args.big_job_ranks, "database": "postgresql", "minutes": args.minutes,
                "api_workers": args.api_workers, "cluster_nice": args.cluster_nice,
                "control_pass_p99_s": passes_p99, "reconcile_pass_p99_s": by_loop["reconcile"],
                "schedule_pass_p99_s": by_loop["schedule"],
                # as timed, with the simulated cluster answering every supervisor one after another
                "control_pass_serial_answers_p99_s": raw_p99,
                "reconcile_pass_serial_answers_p99_s": raw_by_loop["reconcile"],
                "admission_latency_p99_s": p99(fitting), "admission_probes": len(fitting),
                "admission_probes_gpu": len(gpu_fits), "admission_probes_cpu": len(cpu_fits),
                "admission_latency_gpu_p99_s": p99([inf if (lat := latencies.get(j)) is None else lat
                                                    for j, _ in gpu_fits]),
                "admission_latency_p50_s": statistics.median(fitting) if fitting else None,
                "reservations": sum(1 for since, _, _ in reservations if since >= window_start_wall.timestamp()),
                "api_read_p99_s": p99(timings.reads), "api_submit_p99_s": p99(timings.submits),
                "api_errors": timings.errors,
                "prometheus_series": max(samples["series"]), "scrape_s": max(samples["scrape_s"]),
                "supervisor_bytes_per_step": bytes_per_step,
                "supervisor_buffer_bytes": last["buffer_bytes"] if last else None,
                "supervisor_calls_per_poll": cluster_stats["calls_per_poll"].get(big),
                "big_job_nodes": cluster_stats["nodes_per_job"].get(big),
                "starved_tenants": len(db.starved_tenants(window_start_wall, window_end_wall, queued_tenants)),
                "backfilled_jobs": db.admitted_between(big_submitted, waited_until, exclude=big),
                "big_job_started": big_running is not None, "big_job_state": big_state,
                "big_job_wait_s": ((big_running or window_end_wall) - big_submitted).total_seconds(),
                "node_losses": cluster_stats["lost_nodes"],
                **split,  # where each loop's pass time went: cpu, cluster wait, database, other
                "reconcile_slowest_passes": slowest_passes(all_passes, window_start, "reconcile"),
                "launch_p99_s": p99([p[3] for p in all_passes if p[0] == "launch" and p[2] + p[3] >= window_start]),
                # the service process's CPU over the window by thread, in cores: what competes with the passes
                "primary_cpu_by_thread": cpu_shares(threads_before, threads_after, args.minutes * 60),
            }
            link.conn.close()
            console.print("the big job's events:\n  " + "\n  ".join(db.events(big)[:12]))
            for job_id, at in slowest:  # why the slowest probes that fitted waited
                console.print(f"probe {job_id} sent {at - window_start_wall.timestamp():.0f}s into the window, "
                              f"admitted after {latencies.get(job_id)}s:\n  " + "\n  ".join(db.events(job_id)[:6]))
            return result
    finally:
        db.close()
        drop_pg_schema(schema)


def print_table(result: dict) -> None:
    table = Table(title="fleet simulator (bench/fleet)")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in result.items():
        table.add_row(key, f"{value:.3f}" if isinstance(value, float) else str(value))
    console.print(table)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=3.0)
    p.add_argument("--json", type=Path, help="write the figures here")
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--tenants", type=int, default=20)
    p.add_argument("--queued", type=int, default=10_000)
    p.add_argument("--running", type=int, default=500, help="wait (up to --settle-s) for this many running")
    p.add_argument("--settle-s", type=float, default=180)
    p.add_argument("--big-job-ranks", type=int, default=4096)
    p.add_argument("--big-steps", type=int, default=100_000, help="it runs past the window")
    p.add_argument("--node-losses", type=int, default=10)
    p.add_argument("--reads-per-s", type=float, default=20)
    p.add_argument("--submits-per-s", type=float, default=2)
    p.add_argument("--reserve-after-s", type=float, default=30)
    p.add_argument("--api-workers", type=int, default=2, help="processes answering the API (trainyard serve --workers)")
    p.add_argument("--groups-per-s", type=float, default=100, help="placement groups the GCS creates per second")
    p.add_argument("--step-s", type=float, default=1.0)
    p.add_argument("--cluster-nice", type=int, default=10,
                   help="niceness of the simulated cluster's process (the fleet's other machines: on one host "
                        "it yields the cores to the service; 0: it competes with it as an equal)")
    p.add_argument("--min-steps", type=int, default=30)
    p.add_argument("--max-steps", type=int, default=300)
    p.add_argument("--checkpoint-every", type=int, default=25)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--admission-grace-s", type=float, default=5.0,
                   help="after the window, how long a probe sent at its end may still take to be admitted")
    args = p.parse_args()
    random.seed(args.seed)
    result = run(args)
    print_table(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
