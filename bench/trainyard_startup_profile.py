"""Where Trainyard's time to first step goes: one real JobRun with timestamps at every phase.

Used by `bench/ddp_overhead.py --profile` (the default). It changes nothing in
workers/: for the length of one run it swaps `workers.runtime.group.TrainWorker` for a
subclass of the real actor class whose only additions are timestamps (process
start, torch import, module imports, process group, datasets, model, DDP wrap,
Trainer, first step), and wraps `workers.runtime.group.placement_group` to note when the
placement group is ready. Each rank writes its timestamps to
JOB_DIR/profile/rank-<r>.json; the driver adds its own and prints a timeline.

This module must not import torch at top level: the actor class is shipped by
reference, and importing this module in a fresh worker must cost about what the
real actor's module (workers.runtime.actor) costs.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import ray

from workers.runtime.actor import TrainWorker as _RealTrainWorker

_BASE = _RealTrainWorker.__ray_metadata__.modified_class


def _process_start_time() -> float:
    """Wall-clock start of this process (Linux /proc, 10 ms ticks), to tell a fresh process from a pooled one."""
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: start time since boot, in ticks
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))


class _ProfiledTrainWorker(_BASE):
    """The real actor plus timestamps. Signature-agnostic: it passes every argument through."""

    def __init__(self, *args, **kwargs):
        self._t = {"process_start": _process_start_time(), "actor_init_entered": time.time(), "nice": os.nice(0)}
        import torch  # noqa: F401  (the real __init__ imports it first thing; time it alone)

        self._t["torch_imported"] = time.time()
        super().__init__(*args, **kwargs)
        self._t["actor_init_done"] = time.time()

    def assign(self, *args, **kwargs):  # only called where the actor is bound to a rank after start
        self._t["assign_entered"] = time.time()
        try:
            return super().assign(*args, **kwargs)
        finally:
            self._t["assign_done"] = time.time()

    def _save(self) -> None:
        if getattr(self, "storage", None) is None:
            return
        out = Path(self.storage.local_path) / "profile"  # the bench runs on local storage
        out.mkdir(parents=True, exist_ok=True)
        (out / f"rank-{self.rank}.json").write_text(json.dumps({"rank": self.rank, "pid": os.getpid(), **self._t}))

    def setup(self, spec_json, *args, **kwargs):
        t = self._t
        t["setup_entered"] = time.time()
        patched = []
        try:
            import torch.distributed as dist

            import workers.training.trainer as trainer_module  # the real setup imports it too; time it alone

            t["trainyard_modules_imported"] = time.time()

            def timed(owner, name, label):
                fn = getattr(owner, name)

                def inner(*a, **kw):
                    t.setdefault(label + "_start", time.time())
                    try:
                        return fn(*a, **kw)
                    finally:
                        t[label] = time.time()

                setattr(owner, name, inner)
                patched.append((owner, name, fn))

            strategy_cls = type(trainer_module.build_strategy(trainer_module.JobSpec.model_validate(spec_json)))
            timed(dist, "init_process_group", "process_group")
            timed(trainer_module, "build_datasets", "datasets")
            timed(trainer_module, "build_model", "model")
            timed(strategy_cls, "wrap", "ddp_wrap")
            timed(trainer_module.checkpointing, "Checkpointer", "checkpointer")
        except Exception as exc:  # the code under test changed shape: profile what still fits
            t["patch_error"] = repr(exc)
        try:
            return super().setup(spec_json, *args, **kwargs)
        finally:
            for owner, name, fn in reversed(patched):
                setattr(owner, name, fn)
            t["setup_done"] = time.time()
            self._save()

    def train(self, *args, **kwargs):
        self._t["train_entered"] = time.time()
        return super().train(*args, **kwargs)

    def _emit(self, event):
        if event.get("kind") == "step" and "first_step_done" not in self._t:
            self._t["first_step_done"] = event["ts"]
            self._t["first_step_time_s"] = event["step_time_s"]
            self._save()
        super()._emit(event)


ProfiledTrainWorker = ray.remote(max_concurrency=4)(_ProfiledTrainWorker)


def profile_startup(spec, job_dir: Path, job_id: str) -> dict:
    """Run `spec` once through the real JobRun with the profiled actor; return the driver and rank timelines.

    Fresh actors are the profiled subclass; warm pooled actors (if the tree has a pool and
    one runs) are not, so for them only the driver-side timestamps exist.
    """
    import workers.runtime.group as group_module  # here, not at top: the worker must not pay for it
    from service.supervisor.run import JobRun

    driver: dict[str, float] = {}

    class Listener:
        def on_state(self, state, message):
            driver.setdefault(f"state_{state}", time.time())

        def on_event(self, event):
            pass

        def on_step(self, record):
            driver.setdefault("first_on_step", time.time())

    real_pg = group_module.placement_group

    def pg_then_wait(*args, **kwargs):
        driver["placement_group_requested"] = time.time()
        pg = real_pg(*args, **kwargs)
        ray.get(pg.ready())  # WorkerGroup waits on it next; waiting here only adds a timestamp
        driver["placement_group_ready"] = time.time()
        return pg

    def stamp(method, key):
        def inner(*args, **kwargs):
            try:
                return method(*args, **kwargs)
            finally:
                driver.setdefault(key, time.time())
        return inner

    cls = group_module.WorkerGroup
    real_start, real_place = cls.start, getattr(cls, "_place_actors", None)
    group_module.placement_group, group_module.TrainWorker = pg_then_wait, ProfiledTrainWorker
    cls.start = stamp(real_start, "group_start_done")
    if real_place is not None:
        cls._place_actors = stamp(real_place, "actors_placed")
    try:
        run = JobRun(spec, job_dir, job_id, Listener())
        driver["jobrun_run_called"] = time.time()
        summary = run.run()
        driver["jobrun_returned"] = time.time()
    finally:
        group_module.placement_group, group_module.TrainWorker = real_pg, _RealTrainWorker
        cls.start = real_start
        if real_place is not None:
            cls._place_actors = real_place
    ranks = [json.loads(p.read_text()) for p in sorted((Path(job_dir) / "profile").glob("rank-*.json"))]
    if run.steps:
        driver["first_step_done"] = run.steps[0]["ts"]  # slowest rank; a rank's own file overrides it
    return {"driver": driver, "ranks": ranks, "state": summary["state"],
            "first_step_ts": run.steps[0]["ts"] if run.steps else None}


# The timeline, in order: (timestamp key, what the interval ending there was). A row's duration
# is from the previous key present; driver keys and rank keys share one clock (one machine).
TIMELINE = [
    ("jobrun_run_called", "driver: JobRun.run() called"),
    ("placement_group_requested", "driver: job dir, log file, WorkerGroup -> placement group requested"),
    ("placement_group_ready", "driver: placement group ready"),
    ("process_start", "worker process started (negative: pooled/prestarted before the request)"),
    ("actor_init_entered", "ray worker boot: python + ray import, connect, load actor class"),
    ("torch_imported", "import torch"),
    ("actor_init_done", "rest of actor __init__ (other imports, log redirect)"),
    ("actors_placed", "driver: actors placed (pool take / create + assign)"),
    ("assign_entered", "wait for assign()"),
    ("assign_done", "assign() (bind rank, log redirect)"),
    ("setup_entered", "wait for setup() (driver asks rank 0 for address first)"),
    ("trainyard_modules_imported", "import workers.training.trainer (DCP, safetensors, models, data)"),
    ("process_group_start", "spec validate, set threads, use_deterministic_algorithms"),
    ("process_group", "init_process_group (gloo rendezvous, waits for the peer)"),
    ("datasets_start", "Trainer.__init__ before datasets (DeviceMesh, meters)"),
    ("datasets", "datasets (read + tokenise stdlib corpus)"),
    ("model_start", "Trainer: GlobalBatches, to model"),
    ("model", "model build (seeded init)"),
    ("ddp_wrap_start", "Trainer: to DDP wrap"),
    ("ddp_wrap", "DDP wrap (broadcast of parameters, reducer)"),
    ("checkpointer_start", "optimizer (AdamW)"),
    ("checkpointer", "Checkpointer"),
    ("setup_done", "resume check (latest checkpoint), return from setup()"),
    ("group_start_done", "driver: every setup() returned"),
    ("train_entered", "train() entered"),
    ("first_step_done", "first step (batch slice, fwd/bwd x accum, all-reduce, clip, AdamW)"),
    ("first_on_step", "driver: first on_step delivered (poll loop, every 0.25 s)"),
]


def format_profile(prof: dict, title: str = "Trainyard time-to-first-step breakdown") -> str:
    d = prof["driver"]
    t0 = d["jobrun_run_called"]
    ranks = prof["ranks"] or [{"rank": "-"}]
    lines = [f"{title} (one profiled JobRun, {prof['state']}; seconds; 'at' = since JobRun.run() was called,"
             f" '+' = since the previous row)"]
    head = "".join(f" | rank {r['rank']}: {'+':>6} {'at':>6}" for r in ranks)
    lines.append(f"  {'phase':<76}{head}")
    prev = [None] * len(ranks)
    for key, label in TIMELINE:
        cells, present = [], False
        for i, r in enumerate(ranks):
            merged = {**d, **r}
            if key in merged:
                present = True
                dur = merged[key] - prev[i] if prev[i] is not None else 0.0
                cells.append(f" | {'':7} {dur:>+6.2f} {merged[key] - t0:>6.2f}")
                prev[i] = merged[key]
            else:
                cells.append(f" | {'':7} {'':>6} {'':>6}")
        if present:
            lines.append(f"  {label:<76}{''.join(cells)}")
    nice = sorted({r["nice"] for r in prof["ranks"] if "nice" in r})
    if nice:
        lines.append(f"  rank processes run at niceness {nice} (Ray's worker niceness; a torchrun rank runs at "
                     f"{os.nice(0)}), so on a busy node anything at niceness 0 preempts training")
    if not prof["ranks"]:
        lines.append("  (no per-rank rows: the ranks were warm pooled actors, not the profiled class;"
                     " their setup() phases are those of the cold breakdown after 'rest of actor __init__')")
    return "\n".join(lines)
