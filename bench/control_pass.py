"""The control loop's reconcile pass over many running jobs, on PostgreSQL: this tree against another.

    python -m bench.control_pass [--jobs 500] [--passes 40] [--rounds 1] [--before e83d240] [--json OUT]

Each side runs in a subprocess of its own (the tree under test first on PYTHONPATH; `--before REV`
is checked out with `git worktree add`), on a fresh PostgreSQL schema migrated by that tree's own
code: `--jobs` RUNNING jobs, the REAL `Reconciler` with its real metrics (LiveMetrics), and a fake
cluster port: an in-process supervisor per job that behaves like the JobSupervisor actor's `drain`
(records kept until acknowledged, the same status fields), fed one new step per pass in the record
format the supervisor's StepAggregator produces from its ranks' reports. A pass starts every
`--interval` (start to start, as the control loop runs them; 0 = back to back). Per pass: the wall
time of `Reconciler.tick()` and the SQL statements it sent (SQLAlchemy `before_cursor_execute`; an
executemany counts once, its parameter sets are reported beside it). Where the tree feeds the live
metrics on a thread of its own after the commit, that thread's busy time per pass is reported too
(it runs in this process, sharing the GIL and the cores with the passes). Afterwards each side
checks that every step was stored exactly once. Both sides run in the same invocation, one after
the other.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"
RANKS = 4  # per job: each step record carries its ranks' entries, as the real one does


# --- the fake cluster port -----------------------------------------------------


class FakeSupervisor:
    """What the reconciler sees of a JobSupervisor actor: `drain.remote(ack)` answers (through the
    cluster's `gather`) with the records after `ack` and the run's status, as actor.py's drain does."""

    def __init__(self, job_id: str, epoch: int, world_size: int = RANKS, total_steps: int = 2000):
        self.job_id, self.epoch, self.world_size, self.total_steps = job_id, epoch, world_size, total_steps
        self.records: list[dict] = []
        self.seq = self.step = 0
        self.calls: list[str] = []
        self.drain = _Method(self._drain)  # answered through gather, like every call the reconciler waits for
        # calls nobody waits for run at once
        self.cancel = _Method(lambda: self.calls.append("cancel") or True, eager=True)
        self.preempt = _Method(lambda by, epoch: self.calls.append(f"preempt:{by}:{epoch}") or True, eager=True)
        self.start = _Method(self._start, eager=True)
        self.ready = _Method(lambda: True)

    def _start(self, job_id: str, spec: dict, job_uri: str, epoch: int, *rest) -> bool:
        self.calls.append("start")
        self.job_id, self.epoch = job_id, epoch
        self.total_steps = (spec.get("train") or {}).get("steps", self.total_steps)
        return True

    def push(self, record: dict) -> None:
        self.seq += 1
        self.records.append({**record, "seq": self.seq})

    def train_step(self) -> None:
        """One step on every rank, joined by the supervisor's own aggregator into one record."""
        from service.supervisor.aggregate import StepAggregator

        self.step += 1
        agg = StepAggregator(self.world_size, global_batch_size=32)
        joined = None
        now = time.time()
        for rank in range(self.world_size):
            joined = agg.add({"step": self.step, "rank": rank, "loss": 2.0 + 1.0 / self.step, "step_time_s": 0.1,
                              "compute_time_s": 0.08, "comm_time_s": 0.02, "samples": 8, "tokens": 512,
                              "grad_norm": 1.0, "lr": 3e-3, "comm_bytes": 1_000_000, "model_state_bytes": 4_000_000,
                              "model_params": 1_000_000, "peak_flops_per_s": None, "ts": now, "stage": None})
        assert joined is not None
        self.push({"type": "step", **joined})

    def _drain(self, ack: int) -> dict:
        self.records = [r for r in self.records if r["seq"] > ack]
        return {"records": [dict(r) for r in self.records], "job_id": self.job_id, "epoch": self.epoch,
                "started": True, "state": "RUNNING", "restarts": 0, "last_checkpoint_step": None,
                "layout": {"world_size": self.world_size, "dp": self.world_size, "tp": 1, "pp": 1},
                "done": False, "summary": None, "seq": self.seq, "tracking": None}


class _Method:
    """An actor method's `.remote(...)`: a reference that `gather` answers by running the call, or
    (eager) the call run at once."""

    def __init__(self, fn, eager: bool = False):
        self.fn, self.eager = fn, eager

    def remote(self, *args):
        if self.eager:
            self.fn(*args)
        return _Ref(self.fn, args)


class _Ref:
    def __init__(self, fn, args):
        self.fn, self.args = fn, args


class FakeCluster:
    """service/cluster_port.Cluster in-process: supervisors by name, one node of `cpus` CPUs.
    `gather_delay_s`: every gather waits this long first (a slow cluster)."""

    def __init__(self, cpus: float = 10_000.0, gather_delay_s: float = 0.0):
        self.supervisors: dict[str, FakeSupervisor] = {}
        self.cpus, self.gather_delay_s = cpus, gather_delay_s
        self.killed: list[Any] = []
        self.failing: set[str] = set()  # job ids whose drain raises (a FAILED reply)

    def connect(self) -> None:
        pass

    def release(self) -> None:
        pass

    def nodes(self) -> list[dict]:
        return [{"NodeID": "n0", "Alive": True, "NodeManagerAddress": "127.0.0.1",
                 "Resources": {"CPU": self.cpus, "GPU": 0.0}}]

    def available_resources(self) -> dict[str, float]:
        return {"CPU": self.cpus, "GPU": 0.0}

    def available_per_node(self) -> dict[str, dict[str, float]]:
        return {"n0": self.available_resources()}

    def created_group_owners(self) -> set:
        return set()

    def placement_groups(self) -> dict[str, dict]:
        return {}

    def remove_placement_group(self, group_id: str) -> bool:
        return False

    def create_supervisor(self, name: str) -> Any:
        sup = self.supervisors.get(name)
        if sup is None:
            sup = self.supervisors[name] = FakeSupervisor("", 0)
        return sup

    def find_supervisor(self, name: str | None) -> Any | None:
        return self.supervisors.get(name) if name else None

    def named_actors(self) -> list[str]:
        return list(self.supervisors)

    def kill(self, handle: Any) -> None:
        self.killed.append(handle)
        for name, sup in list(self.supervisors.items()):
            if sup is handle:
                del self.supervisors[name]

    def gather(self, refs: dict, timeout_s: float) -> dict:
        from service.cluster_port import Reply, ReplyKind

        if self.gather_delay_s:
            time.sleep(min(self.gather_delay_s, timeout_s))
        replies = {}
        for key, ref in refs.items():
            if key in self.failing:
                replies[key] = Reply(ReplyKind.FAILED, error="RayTaskError: drain raised")
                continue
            try:
                replies[key] = Reply(ReplyKind.ANSWERED, ref.fn(*ref.args))
            except Exception as exc:
                replies[key] = Reply(ReplyKind.FAILED, error=f"{type(exc).__name__}: {exc}")
        return replies


class StatementCounter:
    """SQL statements an engine sends (an executemany counts once; `rows` counts its parameter sets)."""

    def __init__(self, engine):
        from sqlalchemy import event

        self.statements = self.rows = 0
        self.paused = False
        event.listen(engine, "before_cursor_execute", self._count)

    def _count(self, conn, cursor, statement, parameters, context, executemany) -> None:
        if self.paused:
            return
        self.statements += 1
        self.rows += len(parameters) if executemany and parameters is not None else 1

    def take(self) -> tuple[int, int]:
        out = self.statements, self.rows
        self.statements = self.rows = 0
        return out


# --- one side (a child process) ------------------------------------------------


def running_jobs(sessions, cluster: FakeCluster, n: int) -> list[str]:
    """`n` RUNNING jobs of one tenant, each with its supervisor (epoch 1) alive in `cluster`."""
    from service.db import repository as repo
    from service.db import tenants as tenant_repo
    from service.lifecycle import JobState
    from workers.spec import JobSpec

    spec = JobSpec.model_validate({
        "name": "bench", "model": {"name": "gpt", "n_layers": 2, "d_model": 64, "n_heads": 2, "seq_len": 32},
        "data": {"name": "text:pystdlib"},
        "train": {"steps": 2000, "global_batch_size": 32, "micro_batch_size": 8, "lr": 3e-3},
        "parallel": {"dp": RANKS}, "resources": {"workers": RANKS, "cpus_per_worker": 1},
        "checkpoint": {"every_steps": 0}})
    ids = []
    with sessions.begin() as s:
        tenant = tenant_repo.ensure_tenant(s, "bench")
        for _ in range(n):
            job = repo.create_job(s, tenant.id, spec, 0, "sha", None, max_open_jobs=None)
            repo.transition(s, job, JobState.STARTING, "admitted")
            repo.transition(s, job, JobState.RUNNING, "running")
            job.supervisor_epoch = 1
            job.supervisor_name = f"trainyard-supervisor-{job.id}-1"
            cluster.supervisors[job.supervisor_name] = FakeSupervisor(job.id, 1, RANKS, spec.total_steps)
            ids.append(job.id)
    return ids


def run_side(args) -> dict:
    """In the tree on sys.path: the passes, timed and counted."""
    import psycopg
    from sqlalchemy import func, select

    from service.db.engine import make_engine, make_sessionmaker, migrate
    from service.db.models import JobMetric
    from service.live_metrics import LiveMetrics
    from service.reconciler import Reconciler
    from service.settings import Settings

    schema = "bench_" + uuid.uuid4().hex[:10]
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/test?options=-csearch_path%3D{schema}"
    engine = make_engine(url)
    try:
        migrate(engine)
        sessions = make_sessionmaker(engine)
        cluster = FakeCluster()
        ids = running_jobs(sessions, cluster, args.jobs)
        home = Path(tempfile.mkdtemp(prefix="control-pass-"))
        reconciler = Reconciler(sessions, Settings(home=home, database_url=url), launcher=object(),
                                metrics=LiveMetrics(), cluster=cluster)
        counter = StatementCounter(engine)
        feed = getattr(reconciler, "feed", None)  # this tree's metrics feed, on a thread of its own
        passes, statements, rows = [], [], []
        next_start = time.perf_counter()
        for i in range(args.warmup + args.passes):
            for sup in cluster.supervisors.values():
                sup.train_step()
            # A pass every --interval, start to start, as the control loop's reconciler runs them.
            time.sleep(max(0.0, next_start - time.perf_counter()))
            if i == args.warmup and feed is not None:
                feed_busy = feed.busy_s
            counter.take()
            started = time.perf_counter()
            reconciler.tick()
            elapsed = time.perf_counter() - started
            n, r = counter.take()
            next_start = started + args.interval
            if i >= args.warmup:
                passes.append(elapsed)
                statements.append(n)
                rows.append(r)
        if feed is not None:
            reconciler.drain_background()
            feed_per_pass = (feed.busy_s - feed_busy) / len(passes)
        # The final drain acknowledges the last records; then every step is stored exactly once.
        reconciler.tick()
        counter.paused = True
        with sessions() as s:
            stored = s.scalar(select(func.count()).select_from(JobMetric)) or 0
            per_job = dict(s.execute(select(JobMetric.job_id, func.count()).group_by(JobMetric.job_id)).all())
        steps = args.warmup + args.passes
        exact = stored == steps * len(ids) and all(per_job.get(j) == steps for j in ids)
        return {"jobs": len(ids), "passes": len(passes), "interval_s": args.interval, "pass_p50_s": _pct(passes, 50),
                "pass_p99_s": _pct(passes, 99), "pass_max_s": max(passes),
                "statements_per_pass": statistics.median(statements), "executions_per_pass": statistics.median(rows),
                "metrics_feed_s_per_pass": feed_per_pass if feed is not None else None,
                "metric_rows": stored, "stored_exactly_once": exact, "passes_s": passes}
    finally:
        engine.dispose()
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))]


# --- the driver ------------------------------------------------------------------


def side(tree: Path, args) -> dict:
    out = Path(tempfile.mkstemp(suffix=".json")[1])
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--jobs", str(args.jobs), "--passes",
           str(args.passes), "--warmup", str(args.warmup), "--interval", str(args.interval), "--json", str(out)]
    subprocess.run(cmd, env=env, cwd=tree, check=True)
    return json.loads(out.read_text())


def pooled(runs: list[dict]) -> dict:
    """One side's rounds as one result: the passes of all rounds together."""
    passes = [p for r in runs for p in r["passes_s"]]
    feeds = [r["metrics_feed_s_per_pass"] for r in runs]
    return {**runs[0], "rounds": len(runs), "passes": len(passes), "passes_s": passes,
            "pass_p50_s": _pct(passes, 50), "pass_p99_s": _pct(passes, 99), "pass_max_s": max(passes),
            "statements_per_pass": statistics.median(r["statements_per_pass"] for r in runs),
            "executions_per_pass": statistics.median(r["executions_per_pass"] for r in runs),
            "metrics_feed_s_per_pass": None if None in feeds else statistics.fmean(feeds),
            "stored_exactly_once": all(r["stored_exactly_once"] for r in runs)}



def _tree_at(rev: str, path: Path) -> Path:
    from bench.trees import tree_at  # here, not at the top: the child runs this file inside the earlier tree

    return tree_at(rev, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--passes", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1, help="runs of each side, alternating; passes pooled")
    parser.add_argument("--interval", type=float, default=0.5,
                        help="a pass starts this long after the last one started (the service's loop_interval_s)")
    parser.add_argument("--before", default="e83d240", help="the revision to compare with ('' = none)")
    parser.add_argument("--before-tree", default="/tmp/before", help="where its worktree is (made if missing)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        assert args.json is not None
        args.json.write_text(json.dumps(run_side(args)))
        return
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    trees = {f"after ({head}, working tree)": REPO}
    if args.before:
        trees = {f"before ({args.before})": _tree_at(args.before, Path(args.before_tree)), **trees}
    # Rounds alternate the sides, so a neighbour's load on a shared host falls on both alike.
    rounds: dict[str, list[dict]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            rounds[name].append(side(tree, args))
    results = {name: pooled(runs) for name, runs in rounds.items()}
    from bench.table import print_markdown_table

    def feed(r: dict) -> str:
        return "in the pass" if r["metrics_feed_s_per_pass"] is None else f"{r['metrics_feed_s_per_pass']:.3f}"

    rows = [(name, str(r["jobs"]), str(r["passes"]), f"{r['pass_p50_s']:.3f}", f"{r['pass_p99_s']:.3f}",
             f"{r['pass_max_s']:.3f}", f"{r['statements_per_pass']:.0f}", f"{r['executions_per_pass']:.0f}", feed(r),
             "yes" if r["stored_exactly_once"] else "NO") for name, r in results.items()]
    print_markdown_table(("code", "running jobs", "passes", "pass p50 s", "pass p99 s", "pass max s",
                          "SQL statements / pass", "statement executions / pass",
                          "metrics feed s / pass (own thread)", "each step stored once"), rows)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

