"""The three systems that bench/ddp_overhead.py compares, each run once per call.

Every runner returns a dict with at least `ttfs` (time to first step, s), `sps`
(steady-state wall-clock samples/s), `sps_step_time`, `sps_median_step`,
`final_loss`, and the per-step series.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

STEADY_SKIP = 0.2  # fraction of warm-up steps left out of throughput, as JobRun.summary does


def make_spec(steps: int, name: str = "bench-ddp"):
    from workers.spec import JobSpec

    return JobSpec.model_validate({
        "name": name,
        "model": {"name": "gpt", "n_layers": 2, "d_model": 128, "n_heads": 4, "seq_len": 64},
        "data": {"name": "text:pystdlib"},
        "train": {"steps": steps, "global_batch_size": 32, "micro_batch_size": 8, "lr": 3.0e-3,
                  "warmup_steps": min(10, steps), "seed": 0, "loss": "cross_entropy"},
        "parallel": {"dp": 2},
        "resources": {"workers": 2, "cpus_per_worker": 1},
        "checkpoint": {"every_steps": 0, "keep": 1},  # only the final one, after the timed steps
        "fault_tolerance": {"max_restarts": 0},
    })


def steady_throughput(step_ts: list[float], step_times: list[float], global_batch: int) -> dict:
    """Steady-state samples/s three ways (the first 20% of steps skipped).

    step_ts[i] is when step i finished on its slowest rank, step_times[i] that rank's step time.
    `sps`: wall clock, G x steps / elapsed, so it counts everything between steps (telemetry,
    the Python loop); `sps_step_time`: the formula of Trainyard's own summary (G x steps /
    sum of step times); `sps_median_step`: G / median step time, the least disturbed by
    other processes on a shared machine.
    """
    n = len(step_ts)
    k0 = max(1, int(n * STEADY_SKIP))
    if n - k0 < 2:
        return {"sps": None, "steady_window": None, "sps_step_time": None, "sps_median_step": None,
                "slowest_step_s": None}
    return {"sps": global_batch * (n - k0) / (step_ts[-1] - step_ts[k0 - 1]),
            "steady_window": (step_ts[k0 - 1], step_ts[-1]),  # wall clock (time.time()) the sps is taken over
            "sps_step_time": global_batch * (n - k0) / sum(step_times[k0:]),
            "sps_median_step": global_batch / statistics.median(step_times[k0:]),
            "slowest_step_s": max(step_times[k0:])}


def read_rank_files(out_dir: Path) -> tuple[list[dict], list[float], list[float]]:
    ranks = [json.loads(p.read_text()) for p in sorted(out_dir.glob("rank-*.json"))]
    if not ranks:
        raise RuntimeError(f"no rank files in {out_dir}")
    step_ts = [max(r["step_ts"][i] for r in ranks) for i in range(len(ranks[0]["step_ts"]))]
    step_times = [max(r["step_time_s"][i] for r in ranks) for i in range(len(ranks[0]["step_time_s"]))]
    return ranks, step_ts, step_times


# --- A: Trainyard ----------------------------------------------------------


def run_trainyard(spec, work: Path, tag: str) -> dict:
    from service.supervisor.run import JobRun

    arrivals: list[float] = []
    records: list[dict] = []

    class Listener:
        def on_state(self, state, message): pass
        def on_event(self, event): pass

        def on_step(self, record):
            arrivals.append(time.time())
            records.append(record)

    run = JobRun(spec, work / tag, tag, Listener())
    t0 = time.time()
    summary = run.run()
    t_end = time.time()
    if summary["state"] != "SUCCEEDED" or not records:
        raise RuntimeError(f"Trainyard run {tag} ended {summary['state']}: {summary.get('error')}")
    return {**steady_throughput([r["ts"] for r in records], [r["step_time_s"] for r in records],
                                spec.train.global_batch_size),
            "ttfs": arrivals[0] - t0, "ttfs_rank_ts": records[0]["ts"] - t0,
            "warm_workers": getattr(run, "warm_workers", 0),
            "summary_sps": summary["samples_per_s"], "final_loss": summary["final_loss"], "total_s": t_end - t0,
            "summary": summary,
            "step_ts": [r["ts"] - t0 for r in records], "step_time_s": [r["step_time_s"] for r in records]}


# --- B: torchrun -----------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torchrun(spec, spec_file: Path, work: Path, tag: str, script: str = "torchrun_ddp.py",
                 script_args: tuple[str, ...] = (), nproc: int = 2, env_extra: dict[str, str] | None = None) -> dict:
    """`torchrun --nproc-per-node 2 bench/<script>` (the DDP baseline, or bench/torchrun_hf.py with its args)."""
    out = work / tag
    torchrun = Path(sys.executable).parent / "torchrun"
    cmd = [str(torchrun), "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
           "--master-port", str(_free_port()),
           str(ROOT / "bench" / script), "--spec-json", str(spec_file), "--out", str(out), *script_args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore::FutureWarning",
           "PYTHONPATH": os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p),
           **(env_extra or {})}
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with open(out / "torchrun.log", "w") as log:
        rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=600).returncode
    t_end = time.time()
    if rc != 0:
        raise RuntimeError(f"torchrun {tag} exited {rc}:\n" + (out / "torchrun.log").read_text()[-3000:])
    ranks, step_ts, step_times = read_rank_files(out)
    return {**steady_throughput(step_ts, step_times, spec.train.global_batch_size), "ttfs": step_ts[0] - t0,
            "final_loss": statistics.fmean(r["losses"][-1] for r in ranks), "total_s": t_end - t0,
            "step_ts": [t - t0 for t in step_ts], "step_time_s": step_times,
            "phases": {k: max(r["phases"][k] for r in ranks) - t0 for k in ranks[0]["phases"]}}


# --- C: Ray Train ----------------------------------------------------------


def run_raytrain(spec, work: Path, tag: str, workers: int = 2) -> dict:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from bench.torchrun_ddp import ray_train_loop

    out = work / tag
    trainer = TorchTrainer(
        ray_train_loop,
        train_loop_config={"spec_json": spec.model_dump(mode="json"), "out_dir": str(out)},
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=False),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(name=tag, storage_path=str(work / "raytrain-storage")),
    )
    t0 = time.time()
    trainer.fit()
    t_end = time.time()
    ranks, step_ts, step_times = read_rank_files(out)
    return {**steady_throughput(step_ts, step_times, spec.train.global_batch_size),
            "ttfs": step_ts[0] - t0, "total_s": t_end - t0, "step_time_s": step_times,
            "final_loss": statistics.fmean(r["losses"][-1] for r in ranks),
            "phases": {k: max(r["phases"][k] for r in ranks) - t0 for k in ranks[0]["phases"]}}


# --- the cluster: our own local Ray, and the warm pool where the tree has one ------


def start_ray(num_cpus: int) -> float:
    """Start this process's own local Ray, as `trainyard run` does; return the seconds ray.init took."""
    import ray

    from service.ray_client import NAMESPACE, worker_env

    os.environ.pop("RAY_ADDRESS", None)  # never join someone else's cluster
    t0 = time.time()
    # address="local": a new Ray for this process even if another one runs on the machine.
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, namespace=NAMESPACE,
             log_to_driver=False, runtime_env={"env_vars": worker_env()})
    return time.time() - t0


def start_warm_pool(size: int, timeout_s: float = 120.0):
    """The tree's warm worker pool, filled; None where the tree has none (or its API differs)."""
    try:
        from workers.runtime.pool import start_pool
    except ImportError:
        return None
    pool = start_pool(size)
    wait_pool_full(pool, size, timeout_s)
    return pool


def wait_pool_full(pool, size: int, timeout_s: float = 120.0) -> float:
    import ray

    t0 = time.time()
    while time.time() - t0 < timeout_s:
        if ray.get(pool.stats.remote()).get("idle", 0) >= size:
            return time.time() - t0
        time.sleep(0.5)
    raise RuntimeError(f"warm pool not full after {timeout_s:.0f}s")


def stop_warm_pool(pool) -> None:
    import ray

    try:
        ray.get(pool.shutdown.remote(), timeout=30)
    finally:
        ray.kill(pool, no_restart=True)


