"""Checkpoints on an object store: DCP's fsspec writer straight to S3 vs a local staging directory
uploaded in the background (the two designs issue 20 names), on moto's S3 server over HTTP.

    .venv/bin/python bench/checkpoint_store.py [--reps 5] [--d-model 256] [--layers 4]

One process, a gloo group of one (as a rank's checkpoint group), a GPT with Adam state, saved as the
Trainer saves (get_state_dict + dcp.async_save). Per save, median of --reps:
  - blocked: the training loop's wait, the async_save call (it copies the state to CPU before returning);
  - durable: save start -> the checkpoint is complete on the store (.metadata and every shard);
  - restore: a fresh model and optimiser loaded from the store (direct: DCP's fsspec reader; staging:
    download the directory, then DCP's filesystem reader).
The ratio column is staging / direct (> 1: the direct write is better).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402

from bench.table import print_markdown_table  # noqa: E402
from tests.live import free_port  # noqa: E402
from tests.s3_server import S3Server  # noqa: E402
from workers.checkpointing import OPTIM_OPTIONS, RetryPolicy, latest_checkpoint  # noqa: E402
from workers.checkpointing.writer import reader_for, writer_for  # noqa: E402
from workers.models import build_model  # noqa: E402
from workers.spec_loading import parse_spec  # noqa: E402
from workers.storage import Storage  # noqa: E402


def model_and_optimizer(d_model: int, layers: int):
    spec = parse_spec({"name": "bench", "model": {"name": "gpt", "n_layers": layers, "d_model": d_model,
                                                   "n_heads": 4, "seq_len": 64},
                       "data": {"name": "text:pystdlib"},
                       "train": {"steps": 1, "global_batch_size": 8, "micro_batch_size": 8}})
    model = build_model(spec)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.zeros(2, 64, dtype=torch.long)).float().mean().backward()
    optimizer.step()  # Adam state exists, as in a checkpoint mid-run
    return model, optimizer


def state_of(model, optimizer) -> dict:
    model_sd, optim_sd = get_state_dict(model, optimizer, options=OPTIM_OPTIONS)
    return {"model": model_sd, "optim": optim_sd}


def save_direct(job: Storage, step: int, state: dict, group) -> tuple[float, Future]:
    writer = writer_for(job / f"checkpoints/step-{step:08d}", "bench", 0, RetryPolicy(), lambda e: None)
    t0 = time.perf_counter()
    pending = dcp.async_save(state, storage_writer=writer, process_group=group)
    return time.perf_counter() - t0, pending  # type: ignore[return-value]


def save_staged(job: Storage, step: int, state: dict, group, pool: ThreadPoolExecutor, tmp: Path):
    local = tmp / f"step-{step:08d}"
    t0 = time.perf_counter()
    pending = dcp.async_save(state, storage_writer=FileSystemWriter(str(local)), process_group=group)
    blocked = time.perf_counter() - t0

    def upload():
        pending.result()  # type: ignore[union-attr]
        # shards first, .metadata last: the store never shows a complete checkpoint before it is one
        files = sorted(local.iterdir(), key=lambda p: p.name == ".metadata")
        for path in files:
            job.upload(path, f"checkpoints/step-{step:08d}/{path.name}")
    return blocked, pool.submit(upload)


def restore_direct(job: Storage, step: int, model, optimizer) -> float:
    t0 = time.perf_counter()
    state = state_of(model, optimizer)
    dcp.load(state, storage_reader=reader_for(job / f"checkpoints/step-{step:08d}"))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=OPTIM_OPTIONS)
    return time.perf_counter() - t0


def restore_staged(job: Storage, step: int, model, optimizer, tmp: Path) -> float:
    t0 = time.perf_counter()
    local = tmp / f"restore-{step}"
    job.download(f"checkpoints/step-{step:08d}", local)
    state = state_of(model, optimizer)
    dcp.load(state, storage_reader=FileSystemReader(str(local)))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=OPTIM_OPTIONS)
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as tmpdir:
        tmp = Path(tmpdir)
        server = S3Server(tmp / "s3").start()
        os.environ.update(server.env)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
        group = dist.new_group(backend="gloo")
        try:
            model, optimizer = model_and_optimizer(args.d_model, args.layers)
            nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values()) * 3  # params + 2 Adam
            results: dict[str, dict[str, list[float]]] = {"direct": {}, "staging": {}}
            with ThreadPoolExecutor(1) as pool:
                for rep in range(args.reps):
                    for how in ("direct", "staging") if rep % 2 == 0 else ("staging", "direct"):  # interleaved
                        job = Storage.at(server.create_bucket(f"bench-{uuid.uuid4().hex[:8]}") + "/jobs/j")
                        state = state_of(model, optimizer)
                        t0 = time.perf_counter()
                        blocked, pending = (save_direct(job, 1, state, group) if how == "direct"
                                            else save_staged(job, 1, state, group, pool, tmp / f"{how}{rep}"))
                        pending.result()
                        durable = time.perf_counter() - t0
                        assert latest_checkpoint(job) is not None, f"{how}: the checkpoint is not complete"
                        fresh_model, fresh_opt = model_and_optimizer(args.d_model, args.layers)
                        restore = (restore_direct(job, 1, fresh_model, fresh_opt) if how == "direct"
                                   else restore_staged(job, 1, fresh_model, fresh_opt, tmp / f"r{how}{rep}"))
                        for key, value in (("blocked", blocked), ("durable", durable), ("restore", restore)):
                            results[how].setdefault(key, []).append(value)
        finally:
            dist.destroy_process_group()
            server.stop()
    print_save_table(results, args, nbytes, {"direct": "direct (fsspec)", "staging": "local staging + upload"})
    return 0


def print_save_table(results: dict[str, dict[str, list[float]]], args, nbytes: int, columns: dict[str, str]) -> None:
    """The per-checkpoint medians of two ways (`columns`: key -> heading, the base first) and their ratio."""
    (base, base_head), (other, other_head) = columns.items()
    print(f"GPT d_model {args.d_model} x {args.layers} layers + AdamW state, ~{nbytes / 2**20:.1f} MiB per "
          f"checkpoint, one rank, moto S3 server on loopback, median of {args.reps} (load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    rows = []
    for key in ("blocked", "durable", "restore"):
        b, o = statistics.median(results[base][key]), statistics.median(results[other][key])
        rows.append((key, f"{b * 1000:.0f} ms", f"{o * 1000:.0f} ms", f"{o / b:.2f}"))
    print_markdown_table(("per checkpoint", base_head, other_head, f"{other} / {base}"), rows)


if __name__ == "__main__":
    raise SystemExit(main())
