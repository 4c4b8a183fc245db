"""Time to recovery: Trainyard (crash, hang, node loss) beside Ray Train's TorchTrainer + FailureConfig.

Run from the repository root (with the defaults: about 14 minutes on the shared 2-core machine at load
average ~50, roughly 8-10 when it is quieter; `--reps 2 --hang-reps 1 --raytrain-reps 1 --pool-reps 1
--node-reps 1 --straggler-reps 1 --clean-runs 1` takes about half):

    .venv/bin/python bench/recovery.py [--reps 3] [--hang-reps 2] [--node-reps 2] [--raytrain-reps 2]
        [--pool-reps 2] [--straggler-reps 2] [--clean-runs 2] [--fault-step 12] [--steps 24]
        [--rebalance-reps 2] [--rebalance-steps 60]
        [--no-raytrain] [--no-pool] [--no-node-loss] [--no-stragglers] [--json OUT.json]

One small GPT (2 layers, d_model 64, 4 heads, seq_len 32) on the byte-level stdlib text, global
batch 16 in micro-batches of 4, dp=2 on CPU (one thread per rank), a checkpoint every 5 steps:
  1. Trainyard `JobRun` on a local Ray started once by this process (as bench/ddp_overhead.py):
     - crash: `fault_injection: crash` on rank 1 before step --fault-step (the worker calls os._exit);
     - hang: `fault_injection: hang` on rank 1, `fault_tolerance.hang_timeout_s` = --hang-timeout;
     - crash again with a warm worker pool (`workers.runtime.pool.start_pool`) filled before each run;
  2. Ray Train: `TorchTrainer` + `RunConfig(failure_config=FailureConfig(max_failures=1))`, the same
     model/data/loss/LR modules and step (the loop of bench/torchrun_ddp.py) reporting a
     `ray.train.Checkpoint` every 5 steps; rank 1 calls os._exit before the same step on the first
     attempt only (a marker file), on the same running Ray;
  3. straggler detection: `fault_injection: slow` (factor 3) on rank 1 from step --straggler-step,
     policy report, default threshold/window; latency = step of the `straggler` event - that step;
     false positives: `straggler` events per 100 steps over --clean-runs fault-free runs;
     rebalance gain: the same slow rank from step 5 of --rebalance-steps, global batch 64 (micro 8), once
     with policy report and once with policy rebalance (paired, back to back): median samples/s over the second half of the
     steps (the split changed live by then) and wall time from the slowdown to the end, rebalance / report;
  4. node loss: a separate `ray.cluster_utils.Cluster` (0-CPU head, two 2-CPU nodes, as
     tests/service/elastic_scenario.py), 4 workers with min_workers 2, `cluster.remove_node` once
     the job reaches step --fault-step (the job shrinks 4 -> 2).
Measured, per run (all wall clock, time.time() on this one machine):
  - fault time: when the fault fired (the fault-injection marker file's mtime, written just before
    os._exit / the hang; for node loss, just before remove_node);
  - MTTR = fault -> the first step record after the restart (its `ts`: when its slowest rank finished
    it), i.e. training again, replaying from the checkpoint; "new progress" = fault -> the first
    record past the last step done before the fault;
  - detection = fault -> the `restart` event; restart = event -> RUNNING (group formed, checkpoint
    loaded); first step = RUNNING -> first step record. Ray Train: fault -> loop re-entered on the
    restarted workers (its detection + restart), then -> first step;
  - lost work = steps done before the fault - resume step (steps recomputed).
The machine is shared (other engineers' tests run beside this): the numbers are noisy, the table
shows medians with [min-max], and the load average is printed. This is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.ddp_runners import start_ray, start_warm_pool, stop_warm_pool, wait_pool_full  # noqa: E402
from bench.table import print_markdown_table  # noqa: E402

BASE = {
    "name": "bench-recovery",
    "model": {"name": "gpt", "n_layers": 2, "d_model": 64, "n_heads": 4, "seq_len": 32},
    "data": {"name": "text:pystdlib", "max_bytes": 200_000},
    "train": {"steps": 24, "global_batch_size": 16, "micro_batch_size": 4, "lr": 3.0e-3,
              "warmup_steps": 4, "seed": 0, "loss": "cross_entropy"},
    "parallel": {"dp": 2},
    "resources": {"workers": 2, "cpus_per_worker": 1},
    "checkpoint": {"every_steps": 5, "keep": 2},
    "fault_tolerance": {"max_restarts": 2},
}


def make_spec(name: str, steps: int, **overrides):
    """BASE with dotted-key overrides, parsed with fault injection allowed."""
    from workers.spec_loading import parse_spec

    data = copy.deepcopy(BASE)
    data["name"], data["train"]["steps"] = name, steps
    for key, value in overrides.items():
        node = data
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return parse_spec(data, allow_fault_injection=True)


# --- Trainyard ----------------------------------------------------------------

PHASES: list[tuple[str, float, float]] = []  # (name, start, end) of WorkerGroup.start and its actor placement


def time_group_phases() -> None:
    """Wrap WorkerGroup.start/_place_actors (in this process: JobRun runs here) to time a restart's phases."""
    from workers.runtime.group import WorkerGroup

    def timed(name, fn):
        def wrapper(self, *a, **k):
            t0 = time.time()
            try:
                return fn(self, *a, **k)
            finally:
                PHASES.append((name, t0, time.time()))
        return wrapper

    WorkerGroup.start = timed("start", WorkerGroup.start)
    WorkerGroup._place_actors = timed("place", WorkerGroup._place_actors)


def restart_phases(t_restart: float) -> dict:
    """The group start after a restart event: teardown/capacity wait, placement group, actors, setup."""
    start = next(((t0, t1) for n, t0, t1 in PHASES if n == "start" and t0 >= t_restart), None)
    place = next(((t0, t1) for n, t0, t1 in PHASES if n == "place" and t0 >= t_restart), None)
    if start is None or place is None:
        return {}
    return {"ph_before_start_s": start[0] - t_restart, "ph_pg_s": place[0] - start[0],
            "ph_actors_s": place[1] - place[0], "ph_setup_s": start[1] - place[1]}


class Recorder:
    """A RunListener that stamps everything with the wall time it arrived."""

    def __init__(self):
        self.states: list[tuple[float, str]] = []
        self.events: list[tuple[float, str, dict]] = []
        self.records: list[tuple[float, dict]] = []
        self.step = 0

    def on_state(self, state, message):
        self.states.append((time.time(), str(state)))

    def on_event(self, event):
        self.events.append((time.time(), event.kind, event.data()))

    def on_step(self, record):
        self.step = record["step"]
        self.records.append((time.time(), record))


def recovery_of(rec: Recorder, fault_ts: float, done_before: int) -> dict:
    """Split the first recovery after `fault_ts` into its phases (seconds from the fault)."""
    restart = next(((t, d) for t, k, d in rec.events if k == "restart" and t >= fault_ts - 1.0), None)
    if restart is None:
        return {"error": "no restart event"}
    t_restart, data = restart
    running = next((t for t, s in rec.states if s.endswith("RUNNING") and t >= t_restart), None)
    after = [(t, r) for t, r in rec.records if t >= t_restart]
    first = after[0][1] if after else None
    progress = next((r for _, r in after if r["step"] > done_before), None)
    resize = next((d for t, k, d in rec.events if k == "resize" and t >= fault_ts - 1.0), None)
    return {
        "detect_s": t_restart - fault_ts,
        "restart_s": running - t_restart if running else None,
        "first_step_s": first["ts"] - running if first and running else None,
        "mttr_s": first["ts"] - fault_ts if first else None,
        "progress_s": progress["ts"] - fault_ts if progress else None,
        "resume_step": data.get("resume_step"), "cause": data.get("cause"),
        "lost_steps": done_before - data.get("resume_step", 0),
        "first_step_after": first["step"] if first else None,
        "world_after": (resize or {}).get("to", {}).get("world_size"),
        **restart_phases(t_restart),
    }


def run_trainyard_fault(kind: str, work: Path, tag: str, steps: int, fault_step: int, hang_timeout: float) -> dict:
    from service.supervisor.run import JobRun

    overrides = {"fault_injection": [{"at_step": fault_step, "rank": 1, "kind": kind}]}
    if kind == "hang":
        overrides["fault_tolerance.hang_timeout_s"] = hang_timeout
    spec = make_spec(f"bench-{tag}", steps, **overrides)
    rec = Recorder()
    run = JobRun(spec, work / tag, tag, rec)
    t0 = time.time()
    summary = run.run()
    markers = sorted((work / tag / "faults").glob("fired-*"))
    out = {"tag": tag, "state": summary["state"], "restarts": summary["restarts"], "total_s": time.time() - t0,
           "warm_workers": summary.get("warm_workers")}
    if not markers:
        return {**out, "error": "the fault never fired"}
    # The fault fires before step `fault_step` runs: fault_step - 1 steps were done.
    return {**out, **recovery_of(rec, markers[0].stat().st_mtime, fault_step - 1)}


def run_trainyard_straggler(work: Path, tag: str, steps: int, slow_step: int | None) -> dict:
    from service.supervisor.run import JobRun

    overrides = {"supervisor.straggler": {"policy": "report"}, "checkpoint.every_steps": 0}
    if slow_step is not None:
        overrides["fault_injection"] = [{"at_step": slow_step, "rank": 1, "kind": "slow", "factor": 3.0}]
    spec = make_spec(f"bench-{tag}", steps, **overrides)
    rec = Recorder()
    summary = JobRun(spec, work / tag, tag, rec).run()
    stragglers = [d for _, k, d in rec.events if k == "straggler"]
    # rank 1 / rank 0 compute time per step: the slowdown the detector actually saw
    ratios = [(r["step"], r["ranks"][1]["compute_time_s"] / max(r["ranks"][0]["compute_time_s"], 1e-9))
              for _, r in rec.records if len(r.get("ranks", [])) == 2]
    slow_from = slow_step if slow_step is not None else 1
    out = {"tag": tag, "state": summary["state"], "steps": summary["steps"], "events": stragglers,
           "window": spec.supervisor.straggler.window, "threshold": spec.supervisor.straggler.threshold,
           "ratio_median": statistics.median([x for s, x in ratios if s >= slow_from]) if ratios else None,
           "ratio_min_over_max": None}
    if slow_step is None and ratios:  # clean: how far from 1 do equal ranks look here
        per_step = [min(x, 1 / x) for _, x in ratios]
        out["ratio_min_over_max"] = statistics.median(per_step)
        out["frac_below_threshold"] = sum(x < spec.supervisor.straggler.threshold for x in per_step) / len(per_step)
    if slow_step is not None:
        hit = next((d for d in stragglers if d["rank"] == 1 and d["step"] >= slow_step), None)
        out["latency_steps"] = hit["step"] - slow_step + 1 if hit else None  # steps run slow until flagged
        out["false"] = [d for d in stragglers if d["rank"] != 1 or d["step"] < slow_step]
        # rank 1 flagged by noise before its slowdown (and never recovered): no new event can follow
        out["pre_flagged"] = hit is None and any(d["rank"] == 1 for d in out["false"])
    return out


def run_trainyard_slow_rank(work: Path, tag: str, steps: int, policy: str) -> dict:
    """A x3 slow rank 1 from step 5 under `policy`: steady throughput once any rebalance is done."""
    from service.supervisor.run import JobRun

    # A larger global batch than the other runs, so that per-sample work, which a split moves,
    # outweighs the per-step work (optimizer, all-reduce) that every rank does whatever its share.
    spec = make_spec(f"bench-{tag}", steps, **{"supervisor.straggler": {"policy": policy},
                                               "train.global_batch_size": 64, "train.micro_batch_size": 8,
                                               "fault_injection": [{"at_step": 5, "rank": 1, "kind": "slow",
                                                                    "factor": 3.0}]})
    rec = Recorder()
    summary = JobRun(spec, work / tag, tag, rec).run()
    by_step = {r["step"]: r for _, r in rec.records}
    late = [by_step[s]["samples_per_s"] for s in range(steps // 2 + 1, steps + 1) if s in by_step]
    shares = [d["shares"] for _, k, d in rec.events if k == "rebalance"]
    return {"tag": tag, "policy": policy, "state": summary["state"], "shares": shares[0] if shares else None,
            "late_samples_per_s": statistics.median(late) if late else None,
            "slow_to_end_s": by_step[steps]["ts"] - by_step[5]["ts"] if steps in by_step and 5 in by_step else None}


# --- Ray Train ------------------------------------------------------------------


def raytrain_recovery_loop(config: dict) -> None:
    """bench/torchrun_ddp.py's step, plus a ray.train.Checkpoint every N steps, resume, and one crash."""
    import contextlib
    import math

    import ray.train
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from workers.data import build_datasets
    from workers.data.batches import GlobalBatches
    from workers.models import build_model
    from workers.spec import JobSpec
    from workers.training.losses import LOSSES
    from workers.training.lr_schedule import lr_at

    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    entered = time.time()
    spec = JobSpec.model_validate(config["spec_json"])
    torch.set_num_threads(max(1, int(spec.resources.cpus_per_worker)))
    torch.use_deterministic_algorithms(True, warn_only=True)
    train, dp = spec.train, spec.dp
    train_set, _ = build_datasets(spec)
    batches = GlobalBatches(train_set, train.global_batch_size, train.seed)
    model = DistributedDataParallel(build_model(spec), broadcast_buffers=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=train.lr, weight_decay=train.weight_decay, foreach=False)
    loss_fn = LOSSES[train.loss]
    max_norm = train.grad_clip if train.grad_clip is not None else math.inf
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"), weights_only=False)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
    out_dir, every = Path(config["out_dir"]), config["every"]
    marker = out_dir / "crashed"
    log = open(out_dir / f"rank-{rank}.jsonl", "a", buffering=1)
    log.write(json.dumps({"kind": "start", "entered": entered, "ready": time.time(), "start_step": start}) + "\n")
    for s in range(start, train.steps):
        if rank == config["crash_rank"] and s + 1 == config["crash_step"] and not marker.exists():
            marker.write_text(repr(time.time()))
            os._exit(17)
        torch.manual_seed(train.seed * 1_000_003 + s * 4099 + rank)
        model.train()
        micro = list(batches.rank_microbatches(s, rank, dp, train.micro_batch_size))
        loss_sum = 0.0
        for i, (inputs, targets) in enumerate(micro):
            with contextlib.nullcontext() if i == len(micro) - 1 else model.no_sync():
                loss = loss_fn(model(inputs), targets) / len(micro)
                loss.backward()
            loss_sum += loss.item()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], max_norm, foreach=False)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(train, s)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        log.write(json.dumps({"kind": "step", "step": s + 1, "ts": time.time(), "loss": loss_sum}) + "\n")
        if (s + 1) % every == 0 or s + 1 == train.steps:
            with tempfile.TemporaryDirectory() as d:
                ckpt = None
                if rank == 0:
                    torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                                "step": s + 1}, os.path.join(d, "state.pt"))
                    ckpt = ray.train.Checkpoint.from_directory(d)
                ray.train.report({"step": s + 1, "loss": loss_sum}, checkpoint=ckpt)
    log.close()


def run_raytrain_crash(work: Path, tag: str, steps: int, fault_step: int) -> dict:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    spec = make_spec(f"bench-{tag}", steps)
    out = work / tag
    out.mkdir(parents=True, exist_ok=True)
    trainer = TorchTrainer(
        raytrain_recovery_loop,
        train_loop_config={"spec_json": spec.model_dump(mode="json"), "out_dir": str(out),
                           "every": spec.checkpoint.every_steps, "crash_rank": 1, "crash_step": fault_step},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 1}),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(name=tag, storage_path=str(work / "raytrain-storage"),
                             failure_config=FailureConfig(max_failures=1)),
    )
    t0 = time.time()
    trainer.fit()
    result = {"tag": tag, "total_s": time.time() - t0}
    marker = out / "crashed"
    if not marker.exists():
        return {**result, "error": "the crash never fired"}
    fault_ts = float(marker.read_text())
    lines = [json.loads(line) for p in sorted(out.glob("rank-*.jsonl")) for line in p.read_text().splitlines() if line]
    starts = [r for r in lines if r["kind"] == "start" and r["entered"] > fault_ts]
    steps_after = [r for r in lines if r["kind"] == "step" and r["ts"] > fault_ts]
    if not starts or not steps_after:
        return {**result, "error": "no restart seen"}
    resume = starts[0]["start_step"]
    first_step = min(r["step"] for r in steps_after)
    first_ts = max(r["ts"] for r in steps_after if r["step"] == first_step)  # its slowest rank, as Trainyard
    progress = [r["ts"] for r in steps_after if r["step"] == fault_step]
    entered = max(r["entered"] for r in starts)
    return {**result, "detect_s": None, "restart_s": entered - fault_ts, "first_step_s": first_ts - entered,
            "mttr_s": first_ts - fault_ts, "progress_s": max(progress) - fault_ts if progress else None,
            "resume_step": resume, "lost_steps": fault_step - 1 - resume, "first_step_after": first_step}


# --- node loss on a multi-node cluster on this machine ----------------------------


def run_node_loss(work: Path, reps: int, steps: int, fault_step: int,
                  storages: tuple[str, ...] = ("local",)) -> dict[str, list[dict]]:
    """Per storage ("local": a directory of this machine, which all its Ray nodes share; "s3": a bucket on
    moto's S3 server), `reps` node losses, the storages interleaved."""
    import ray
    from ray.cluster_utils import Cluster

    from service.ray_client import connect
    from service.settings import Settings
    from service.supervisor.run import JobRun

    runs: dict[str, list[dict]] = {where: [] for where in storages}
    s3 = None
    if "s3" in storages:
        from tests.s3_server import S3Server

        s3 = S3Server(work / "s3").start()
        os.environ.update(s3.env)  # JobRun runs here: its ranks get the store's variables from this process
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        cluster.add_node(num_cpus=2)
        doomed = cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        connect(Settings(ray_address=cluster.address, home=work / "cluster-home"))
        for i, where in [(i, w) for i in range(reps) for w in (storages if i % 2 == 0 else storages[::-1])]:
            tag = f"node-{where}-{i}"
            spec = make_spec(f"bench-{tag}", steps,
                             **{"resources.workers": 4, "resources.min_workers": 2, "parallel.dp": 4})
            rec = Recorder()
            job = work / tag if s3 is None or where == "local" else s3.create_bucket(tag) + f"/jobs/{tag}"
            run = JobRun(spec, job, tag, rec)
            box: dict = {}
            thread = threading.Thread(target=lambda: box.setdefault("summary", run.run()), daemon=True)
            t0 = time.time()
            thread.start()
            deadline = time.monotonic() + 300
            while rec.step < fault_step - 1 and thread.is_alive() and time.monotonic() < deadline:
                time.sleep(0.05)
            done_before = rec.step
            fault_ts = time.time()
            cluster.remove_node(doomed)  # kills the raylet and the two ranks on it
            thread.join(600)
            summary = box.get("summary") or {"state": "TIMEOUT", "restarts": None}
            r = {"tag": tag, "state": summary["state"], "restarts": summary["restarts"], "total_s": time.time() - t0,
                 "remove_node_s": None, **recovery_of(rec, fault_ts, done_before)}
            runs[where].append(r)
            print(f"node loss {i} ({where}): {_summary_line(r)}", flush=True)
            if sum(map(len, runs.values())) < reps * len(storages):
                doomed = cluster.add_node(num_cpus=2)  # capacity back for the next repetition
                cluster.wait_for_nodes()
                time.sleep(2.0)
    finally:
        ray.shutdown()
        cluster.shutdown()
        if s3 is not None:
            s3.stop()
    return runs


# --- summarising ----------------------------------------------------------------


def _fmt(x, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def _summary_line(r: dict) -> str:
    if r.get("error"):
        return f"{r.get('state', '?')}: {r['error']}"
    return (f"MTTR {_fmt(r.get('mttr_s'), '.2f')} s (detect {_fmt(r.get('detect_s'), '.2f')}, restart "
            f"{_fmt(r.get('restart_s'), '.2f')}, first step {_fmt(r.get('first_step_s'), '.2f')}), new progress "
            f"{_fmt(r.get('progress_s'), '.2f')} s, resume step {r.get('resume_step')}, lost {r.get('lost_steps')} "
            f"steps, state {r.get('state', 'SUCCEEDED')}"
            + (f", world size after {r['world_after']}" if r.get("world_after") else "") + f", total {r['total_s']:.1f} s")


def med(runs: list[dict], key: str) -> tuple[float | None, float | None, float | None]:
    vals = [r[key] for r in runs if r.get(key) is not None and not r.get("error")]
    return (statistics.median(vals), min(vals), max(vals)) if vals else (None, None, None)


def cell(runs: list[dict], key: str, spec: str = ".2f") -> str:
    m, lo, hi = med(runs, key)
    if m is None:
        return "-"
    return _fmt(m, spec) if lo == hi else f"{_fmt(m, spec)} [{_fmt(lo, spec)}-{_fmt(hi, spec)}]"


def print_table(rows: list[tuple[str, list[dict]]]) -> None:
    head = ("scenario", "runs ok", "MTTR s (fault->training)", "detect s", "restart s", "first step s",
            "new progress s", "lost steps")
    body = []
    for name, runs in rows:
        ok = [r for r in runs if not r.get("error") and r.get("mttr_s") is not None]
        body.append((name, f"{len(ok)}/{len(runs)}", cell(runs, "mttr_s"), cell(runs, "detect_s"),
                     cell(runs, "restart_s"), cell(runs, "first_step_s"), cell(runs, "progress_s"),
                     cell(runs, "lost_steps", ".0f")))
    print_markdown_table(head, body)


def print_phases(rows: list[tuple[str, list[dict]]]) -> None:
    head = ("Trainyard restart: where the time goes", "detect", "teardown+capacity", "placement group",
            "actors (create/assign)", "setup (rendezvous, data, model, ckpt load)", "-> first step")
    body = []
    for name, runs in rows:
        if not any(r.get("ph_actors_s") is not None for r in runs):
            continue
        body.append((name, cell(runs, "detect_s"), cell(runs, "ph_before_start_s"), cell(runs, "ph_pg_s"),
                     cell(runs, "ph_actors_s"), cell(runs, "ph_setup_s"), cell(runs, "first_step_s")))
    if not body:
        return
    print_markdown_table(head, body)


def main() -> int:
    parser = argparse.ArgumentParser(description="Trainyard vs Ray Train: time to recovery; straggler detection")
    parser.add_argument("--steps", type=int, default=24, help="steps per fault run")
    parser.add_argument("--fault-step", type=int, default=12, help="the fault fires before this (1-based) step")
    parser.add_argument("--reps", type=int, default=3, help="Trainyard crash runs (cold)")
    parser.add_argument("--hang-reps", type=int, default=2)
    parser.add_argument("--hang-timeout", type=float, default=5.0, help="fault_tolerance.hang_timeout_s for hangs")
    parser.add_argument("--pool-reps", type=int, default=2, help="Trainyard crash runs with a warm pool")
    parser.add_argument("--raytrain-reps", type=int, default=2)
    parser.add_argument("--node-reps", type=int, default=2)
    parser.add_argument("--straggler-reps", type=int, default=2, help="runs with a slow (x3) rank")
    parser.add_argument("--straggler-step", type=int, default=10)
    parser.add_argument("--straggler-steps", type=int, default=30)
    parser.add_argument("--clean-runs", type=int, default=2, help="fault-free runs for the false-positive rate")
    parser.add_argument("--clean-steps", type=int, default=60)
    parser.add_argument("--rebalance-reps", type=int, default=2, help="pairs of slow-rank runs, report vs rebalance")
    parser.add_argument("--rebalance-steps", type=int, default=60)
    parser.add_argument("--no-raytrain", action="store_true")
    parser.add_argument("--no-pool", action="store_true")
    parser.add_argument("--no-node-loss", action="store_true")
    parser.add_argument("--node-storage", default="local",
                        help="where node-loss jobs keep checkpoints: local, s3 (moto's server) or local,s3")
    parser.add_argument("--no-stragglers", action="store_true")
    parser.add_argument("--num-cpus", type=int, default=8, help="logical CPUs of the local Ray")
    parser.add_argument("--json", type=Path, help="also write every measurement here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    os.environ.setdefault("RAY_TRAIN_ENABLE_STATE_TRACKING", "0")

    import ray

    time_group_phases()
    work = Path(tempfile.mkdtemp(prefix="trainyard-recovery-"))
    res: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "loadavg_before": os.getloadavg(),
                 "crash": [], "hang": [], "pool": [], "raytrain": [], "node": {}, "straggler": [], "clean": [],
                 "rebalance": [], "notes": []}
    t_bench = time.time()
    print(f"work dir {work}; load average {res['loadavg_before'][0]:.1f} on {os.cpu_count()} CPUs", flush=True)

    def fault_runs(key: str, label: str, n: int, fn, *fargs) -> None:
        for i in range(n):
            try:
                r = fn(*fargs, f"{key}-{i}")
            except Exception as exc:  # one broken run must not lose the table
                r = {"tag": f"{key}-{i}", "error": f"{type(exc).__name__}: {str(exc)[:300]}", "total_s": 0.0}
            res[key].append(r)
            print(f"{label} {i}: {_summary_line(r)}", flush=True)

    try:
        res["ray_init_s"] = start_ray(args.num_cpus)
        time.sleep(2.0)
        crash = lambda tag: run_trainyard_fault("crash", work, tag, args.steps, args.fault_step, 0)  # noqa: E731
        fault_runs("crash", "Trainyard crash (cold)", args.reps, crash)
        fault_runs("hang", "Trainyard hang", args.hang_reps,
                   lambda tag: run_trainyard_fault("hang", work, tag, args.steps, args.fault_step, args.hang_timeout))
        if not args.no_raytrain:
            fault_runs("raytrain", "Ray Train crash", args.raytrain_reps,
                       lambda tag: run_raytrain_crash(work, tag, args.steps, args.fault_step))
        if not args.no_pool and args.pool_reps:
            pool = start_warm_pool(4)
            if pool is None:
                res["notes"].append("no warm pool in this tree: warm-pool rows skipped")
            else:
                try:
                    def pooled(tag):
                        wait_pool_full(pool, 4)
                        return crash(tag)
                    fault_runs("pool", "Trainyard crash (warm pool)", args.pool_reps, pooled)
                finally:
                    stop_warm_pool(pool)
        if not args.no_stragglers:
            for i in range(args.straggler_reps):
                r = run_trainyard_straggler(work, f"straggler-{i}", args.straggler_steps, args.straggler_step)
                res["straggler"].append(r)
                found = "flagged before the slowdown (noise)" if r["pre_flagged"] else r["latency_steps"]
                print(f"straggler {i}: detected after {found} slow steps (window {r['window']}), "
                      f"other events {len(r['false'])}; median compute ratio rank1/rank0 while slow "
                      f"{_fmt(r['ratio_median'], '.2f')}", flush=True)
            for i in range(args.clean_runs):
                r = run_trainyard_straggler(work, f"clean-{i}", args.clean_steps, None)
                res["clean"].append(r)
                print(f"clean {i}: {len(r['events'])} straggler events in {r['steps']} steps; per-step fast/slow "
                      f"compute ratio median {_fmt(r['ratio_min_over_max'], '.2f')}, below threshold in "
                      f"{100 * r.get('frac_below_threshold', 0):.0f}% of steps", flush=True)
            for i in range(args.rebalance_reps):
                pair = {p: run_trainyard_slow_rank(work, f"{p}-{i}", args.rebalance_steps, p)
                        for p in ("report", "rebalance")}
                res["rebalance"].append(pair)
                print(f"slow rank {i}: " + "; ".join(
                    f"{p} {r['state']} shares {r['shares']} {_fmt(r['late_samples_per_s'])} samples/s, "
                    f"{_fmt(r['slow_to_end_s'], '.2f')} s from the slowdown to the end" for p, r in pair.items()),
                    flush=True)
    finally:
        ray.shutdown()
    if not args.no_node_loss and args.node_reps:
        try:
            res["node"] = run_node_loss(work, args.node_reps, args.steps, args.fault_step,
                                        tuple(args.node_storage.split(",")))
        except Exception as exc:
            res["notes"].append(f"node loss failed: {type(exc).__name__}: {str(exc)[:300]}")
    res["loadavg_after"] = os.getloadavg()
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)

    print()
    print(f"Time to recovery: GPT 2x64, seq 32, global batch 16 (micro 4), dp=2 on CPU, {args.steps} steps, fault "
          f"before step {args.fault_step}, checkpoint every 5 steps; load average before "
          f"{res['loadavg_before'][0]:.1f}, after {res['loadavg_after'][0]:.1f} on {os.cpu_count()} CPUs (shared: noisy)")
    rows = [("Trainyard crash (cold workers)", res["crash"])]
    if res["pool"]:
        rows.append(("Trainyard crash (warm pool)", res["pool"]))
    rows.append((f"Trainyard hang (timeout {args.hang_timeout:.0f} s)", res["hang"]))
    for where, node_runs in res["node"].items():
        rows.append((f"Trainyard node loss (4 -> 2 workers, {where} storage)", node_runs))
    if res["raytrain"]:
        rows.append(("Ray Train crash (FailureConfig)", res["raytrain"]))
    print_table(rows)
    print()
    print_phases(rows)
    print()
    ty, rt = med(res["crash"], "mttr_s")[0], med(res["raytrain"], "mttr_s")[0]
    if ty is not None and rt is not None:
        print(f"crash MTTR Trainyard / Ray Train = {ty:.2f} / {rt:.2f} = {ty / rt:.3f} "
              f"(target < 1; Trainyard crash MTTR < 15 s: {'yes' if ty < 15 else 'NO'})")
    tp = med(res["pool"], "mttr_s")[0]
    if ty is not None and tp is not None:
        print(f"crash MTTR warm pool / cold = {tp:.2f} / {ty:.2f} = {tp / ty:.3f}")
    if res["straggler"]:
        lat = [r["latency_steps"] for r in res["straggler"]]
        pre = sum(r["pre_flagged"] for r in res["straggler"])
        fp_slow = sum(len(r["false"]) for r in res["straggler"])
        print(f"straggler (slow x3 on rank 1 from step {args.straggler_step}, window "
              f"{res['straggler'][0]['window']}): detected after {lat} slow steps "
              f"(median {_fmt(statistics.median([x for x in lat if x is not None]) if any(x is not None for x in lat) else None, '.0f')}); "
              f"wrong-rank/early events in those runs: {fp_slow} ({pre} run(s) had rank 1 flagged before its slowdown); "
              f"the minimum with window w is w // 2 + 1 slow steps")
    if res["rebalance"]:
        ok = [p for p in res["rebalance"] if all(r["state"] == "SUCCEEDED" and r["late_samples_per_s"]
                                                  and r["slow_to_end_s"] for r in p.values())]
        gain = [p["rebalance"]["late_samples_per_s"] / p["report"]["late_samples_per_s"] for p in ok]
        speedup = [p["report"]["slow_to_end_s"] / p["rebalance"]["slow_to_end_s"] for p in ok]
        print(f"rebalance vs report with a x3 slow rank ({len(ok)}/{len(res['rebalance'])} pairs ok): steady "
              f"samples/s x{_fmt(statistics.median(gain) if gain else None, '.2f')} {[round(g, 2) for g in gain]}; "
              f"slowdown -> end, detection included, x{_fmt(statistics.median(speedup) if speedup else None, '.2f')} "
              f"{[round(x, 2) for x in speedup]}; shares {[p['rebalance']['shares'] for p in ok]}")
    if res["clean"]:
        events = sum(len(r["events"]) for r in res["clean"])
        steps = sum(r["steps"] for r in res["clean"])
        print(f"false positives over {len(res['clean'])} clean runs: {events} straggler events in {steps} steps "
              f"= {100.0 * events / max(steps, 1):.2f} per 100 steps")
    for note in res["notes"]:
        print("note:", note)
    print("columns: detect = fault -> restart event (Ray Train: not observable, included in restart); restart = "
          "-> RUNNING (Ray Train: -> loop re-entered); first step = -> first step record; MTTR = their sum; "
          "new progress = fault -> first step past the pre-fault work; medians [min-max]")
    print(f"\nbench wall time {time.time() - t_bench:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(res, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
