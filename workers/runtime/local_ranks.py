"""Train jobs on ranks of this machine without Ray or the control plane: one process per rank
(torch.multiprocessing), each running the same Trainer the Ray actor runs (workers/runtime/actor.py).

For the device check (bench/device_check.py) and for tests that must see inside a rank (the
collective audit). Each process joins one process group (NCCL on a GPU, gloo otherwise) and
trains the given jobs one after the other in it, so a table of jobs pays for one start.
"""

from __future__ import annotations

import contextlib
import os
import queue as queue_module
import socket
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def device_for(device_type: str, rank: int) -> torch.device:
    """LOCAL_RANK's GPU on CUDA (here the rank: one machine), the CPU otherwise."""
    return torch.device("cuda", rank % torch.cuda.device_count()) if device_type == "cuda" else torch.device("cpu")


def train_job(spec, rank: int, world: int, device: torch.device, job_dir: Path, audit: bool = False) -> dict:
    """One job on this rank, start to finish, as TrainWorker.train runs it. With `audit`, every
    collective of the job is recorded and the result says which break the group/device rule."""
    from workers.parallel.collective_audit import CollectiveRecorder, violations
    from workers.training.control import RankControl
    from workers.training.trainer import Trainer

    steps: list = []
    recorder = CollectiveRecorder()
    with recorder if audit else contextlib.nullcontext():
        trainer = Trainer(spec, rank, world, device, job_dir)
        trainer.resume_from_latest()
        result = trainer.run(lambda event: steps.append(getattr(event, "record", None)), RankControl())
    result["losses"] = [r["loss"] for r in steps if isinstance(r, dict) and "loss" in r]
    result["records"] = [r for r in steps if isinstance(r, dict)]
    if audit:
        cpu_groups = {str(g.group_name) for g in trainer.control_groups.groups()}
        cpu_groups.add(str(trainer.checkpointer.group.group_name))
        result["violations"] = violations(recorder.seen, device, cpu_groups)
        result["sites"] = sorted({(c.site, c.group in cpu_groups) for c in recorder.seen})
    return result


def _rank_main(rank: int, world: int, port: int, device_type: str, jobs: list[tuple[str, object, str]],
               audit: bool, queue) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    device = device_for(device_type, rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world, timeout=timedelta(seconds=300),
                            device_id=device if device.type == "cuda" else None)
    try:
        for name, spec, job_dir in jobs:
            try:
                result = train_job(spec, rank, world, device, Path(job_dir) / name, audit)
                queue.put((name, rank, {"state": "SUCCEEDED", **result}))
            except Exception as exc:  # one job's failure is a row of the table, not the end of the table
                queue.put((name, rank, {"state": "FAILED", "error": f"{type(exc).__name__}: {exc}",
                                        "trace": traceback.format_exc()}))
                if world > 1:  # peers would hang in the job's next collective; a lone rank goes on
                    raise
    finally:
        dist.destroy_process_group()


def run_jobs(jobs: list[tuple[str, object]], world: int, job_dir: str, device_type: str = "cpu",
             audit: bool = False, timeout_s: float = 600) -> dict[str, list[dict]]:
    """Train each (name, JobSpec) on `world` ranks; returns name -> each rank's result dict."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    named = [(name, spec, job_dir) for name, spec in jobs]
    procs = mp.start_processes(_rank_main, args=(world, free_port(), device_type, named, audit, queue),
                               nprocs=world, start_method="spawn", join=False)
    results: dict[str, list[dict]] = {name: [{} for _ in range(world)] for name, _ in jobs}
    deadline, expected = time.monotonic() + timeout_s, len(jobs) * world
    while expected and time.monotonic() < deadline:
        try:
            name, rank, result = queue.get(timeout=1.0)
        except queue_module.Empty:
            dead = [p.exitcode for p in procs.processes if p.exitcode not in (None, 0)]
            if dead:  # a rank exited (an injected crash, or a failure): the job ends here
                break
            continue
        results[name][rank] = result
        expected -= 1
        if result["state"] == "FAILED" and world > 1:  # the rank raised: its peers would hang
            break
    for p in procs.processes:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
    for rows in results.values():
        for rank, row in enumerate(rows):
            if not row:
                code = procs.processes[rank].exitcode
                row.update(state="FAILED", error=f"rank {rank} gave no result (exit code {code})")
    return results
