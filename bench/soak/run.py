"""The soak, start to end: services up, a job stream and the chaos schedule for the set duration,
the drain, the fault-free twins, the table; every service it started is stopped and waited for."""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench.soak import collect, hostile
from bench.soak.chaos import CLUSTER_FAULTS, Chaos, Submit, schedule
from bench.soak.cluster import RayNodes
from bench.soak.jobs import JobPlan, install_program, plan_stream, twin_of
from bench.soak.ledger import TERMINAL, JobRecord, Ledger
from bench.soak.postgres import PrivatePostgres
from bench.soak.replicas import Api, Replicas


@dataclass(frozen=True)
class SoakConfig:
    minutes: float
    seed: int = 1
    nodes: int = 3
    cpus_per_node: int = 4
    max_active: int = 3  # jobs training at once: this is a 2-core machine
    fault_share: float = 0.5  # of stream jobs that carry a rank fault
    json_out: Path | None = None
    keep: bool = False  # keep the work directory (every replica's and the database's log)

    @property
    def chaos_s(self) -> float:
        return 0.75 * self.minutes * 60

    @property
    def stream_s(self) -> float:
        return 0.7 * self.minutes * 60


class Stream(threading.Thread):
    """Submits the planned jobs, keeping `max_active` unfinished, until told to stop."""

    def __init__(self, api: Api, submit: Submit, plans: list[JobPlan], ledger: Ledger, max_active: int, until: float):
        super().__init__(name="soak-stream", daemon=True)
        self.api, self.submit, self.plans, self.ledger = api, submit, plans, ledger
        self.max_active, self.until = max_active, until

    def run(self) -> None:
        plans = iter(self.plans)
        while time.monotonic() < self.until:
            try:
                refresh(self.api, self.ledger)
                if sum(j.state not in TERMINAL for j in self.ledger.jobs) < self.max_active:
                    plan = next(plans)
                    job_id = self.submit.one(plan)
                    if job_id:
                        self.ledger.add_job(JobRecord(plan, job_id, time.time()))
            except Exception as exc:  # a soak bug must not end the stream silently: reported in the table
                self.ledger.soak_errors.append(f"stream: {type(exc).__name__}: {str(exc)[:200]}")
            time.sleep(1.0)


def refresh(api: Api, ledger: Ledger) -> None:
    for record in list(ledger.jobs):
        if record.state not in TERMINAL:
            try:
                resp = api.request("GET", f"/v1/jobs/{record.id}")
            except RuntimeError:  # no replica answered this moment
                return
            if resp.status_code == 200:  # anything else (a 5xx, counted by `api`) is read again next time
                record.state, record.step = resp.json()["state"], resp.json().get("step") or 0


DRAIN_STALL_S = 180.0  # past the deadline, a job that moved within this long is slow, not lost
DRAIN_CAP_S = 900.0  # ... up to this long past the deadline


def drain(api: Api, ledger: Ledger, deadline: float) -> None:
    """Until every job has ended; past `deadline`, only while some unfinished job still makes progress
    (a new step or state): on a loaded machine a healthy job can be slow, and only a stuck one is lost."""
    last_seen: dict[str, tuple[str, int]] = {}
    moved_at = time.monotonic()
    while True:
        refresh(api, ledger)
        if all(j.state in TERMINAL for j in ledger.jobs):
            return
        now = time.monotonic()
        seen = {j.id: (j.state, j.step) for j in ledger.jobs}
        if seen != last_seen:
            last_seen, moved_at = seen, now
        if now > deadline and (now - moved_at > DRAIN_STALL_S or now > deadline + DRAIN_CAP_S):
            return
        time.sleep(1.0)


def soak(config: SoakConfig) -> Ledger:
    rng = random.Random(config.seed)
    ledger = Ledger()
    work = Path(tempfile.mkdtemp(prefix="trainyard-soak-"))
    os.chmod(work, 0o755)  # the private PostgreSQL runs as its own user below it
    pg = nodes = replicas = None
    t_start = time.monotonic()
    try:
        pg = PrivatePostgres(work / "pg").start()
        nodes = RayNodes(config.nodes, config.cpus_per_node)
        replicas = Replicas(work, pg.url, nodes.address)
        replicas.start()
        api = Api(replicas)
        code_dir = install_program(replicas.storage)
        token = hostile.hostile_tenant(api)

        def accepted(plan: JobPlan, job_id: str | None, refusal: str | None) -> None:
            if job_id:
                ledger.add_job(JobRecord(plan, job_id, time.time()))
            else:
                ledger.refused_submits.append(f"{plan.name}: {refusal}")

        submit = Submit(api, code_dir, accepted)
        print(f"soak: services up in {time.monotonic() - t_start:.0f} s; seed {config.seed}", flush=True)
        t0, wall0 = time.monotonic(), time.time()
        stream = Stream(api, submit, plan_stream(rng, 10_000, config.fault_share), ledger, config.max_active,
                        t0 + config.stream_s)
        stream.start()
        while not ledger.jobs and stream.is_alive():
            time.sleep(0.5)
        chaos = Chaos(rng, api, replicas, nodes, pg, submit, token, victim=ledger.jobs[0].id)
        planned_faults = schedule(rng, config.chaos_s)
        for n, planned in enumerate(planned_faults):
            # faults run one at a time, so on a loaded machine the schedule can outrun the window:
            # past it, stop once every kind has been injected (the rest are reported as skipped)
            if time.monotonic() > t0 + config.chaos_s and {f.kind for f in ledger.faults} >= set(CLUSTER_FAULTS):
                print(f"soak: chaos window over; {len(planned_faults) - n} planned faults skipped", flush=True)
                break
            time.sleep(max(0.0, t0 + planned.at_s - time.monotonic()))
            try:
                record = chaos.inject(planned.kind)
            except Exception as exc:  # the soak's own failure, reported in the table rather than losing it
                ledger.soak_errors.append(f"{planned.kind}: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            if record is None:
                print(f"soak: {planned.kind}: nothing to hit, not injected", flush=True)
                continue
            ledger.add_fault(record)
            print(f"soak: {record.kind} at +{record.at - wall0:.0f} s: "
                  f"{'recovered in %.1f s' % record.ttr_s if record.ttr_s is not None else 'NOT recovered'}"
                  f" ({record.detail})", flush=True)
        stream.join()
        try:
            drain(api, ledger, t0 + config.minutes * 60 + 120)
            collect.mark_hits(ledger)
            for i, kind in enumerate(collect.kinds_without_twin(ledger)):
                plan = twin_of(JobPlan(kind, kind, None), i)
                accepted(plan, submit.one(plan), None)
            drain(api, ledger, time.monotonic() + 240)
            collect.read_jobs(api, ledger, replicas.storage)
            ledger.twins = collect.twin_checks(ledger)
        except Exception as exc:  # the table is still printed, with what was read
            ledger.soak_errors.append(f"collect: {type(exc).__name__}: {str(exc)[:200]}")
        ledger.server_errors = dict(api.server_errors)
        ledger.server_error_examples = list(api.examples)
    finally:
        if replicas:
            replicas.stop()
        if nodes:
            nodes.shutdown()
        if pg:
            pg.stop()
        if config.keep:
            print(f"soak: logs kept under {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(f"soak: {config.minutes:g} min, seed {config.seed}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}; wall {time.monotonic() - t_start:.0f} s")
    ledger.print_table()
    if config.json_out:
        config.json_out.write_text(json.dumps(ledger.as_json(), indent=1, default=str))
    return ledger
