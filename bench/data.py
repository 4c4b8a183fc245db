"""Input pipeline throughput and memory: Trainyard's file loader beside a plain PyTorch DataLoader loop.

    .venv/bin/python bench/data.py [--steps 60 --batch 32 --shards 8]

A model whose step is cheap enough for input to matter (an MLP over 2048-token rows: the row's
tokens, scaled, -> 256 -> 256 classes, predicting the token that follows the row) trains on `tokens`
shards (uint16) written by the bench into a temporary directory. Each loop runs in its own fresh
process, one after another on the same files (the page cache is warm for all; the first
interleaved warm-up pass reads every file once):

- plain DataLoader: a 20-line map-style Dataset over np.memmap windows, `DataLoader(shuffle=True,
  batch_size, num_workers=2, persistent_workers=True)`: what a user writes by hand.
- trainyard num_workers 0/1/2: workers.data (TokenShards + MapFeed), the code a rank runs:
  the seeded global batch of each step, loader workers, prefetch_factor 4.

samples/s: rows trained per second over the steps after the first 5 (the workers' start).
Memory: one rank (the trainer's process with num_workers 2, its loader workers included) reading
the same number of steps from datasets 10x, 100x and 1000x as large as what the loader holds in
flight (num_workers x prefetch_factor micro-batches): peak RSS of the rank and of its largest
worker (ru_maxrss: mapped file pages count too, and a forked worker starts with the rank's pages), and
the peak anonymous memory (RssAnon, sampled every 10 ms) of the rank and of any worker: what cannot be
reclaimed. Flat across the three is the target.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.table import print_markdown_table  # noqa: E402

SEQ = 2048


class PlainWindows(torch.utils.data.Dataset):
    """What a user writes by hand: fixed windows of memory-mapped token files."""

    def __init__(self, paths: list[str]):
        self.maps = [np.memmap(p, dtype=np.uint16, mode="r") for p in paths]
        self.per = [(len(m) - 1) // SEQ for m in self.maps]
        self.starts = np.cumsum([0] + self.per)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, i: int):
        k = int(np.searchsorted(self.starts, i, side="right") - 1)
        w = np.array(self.maps[k][(i - self.starts[k]) * SEQ:(i - self.starts[k]) * SEQ + SEQ + 1], dtype=np.int64)
        t = torch.from_numpy(w)
        return t[:-1], t[1:]


def mlp() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(SEQ, 256), nn.ReLU(), nn.Linear(256, 256))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def train_step(model, opt, x: torch.Tensor, y: torch.Tensor) -> None:
    loss = nn.functional.cross_entropy(model(x.float() / 256.0), y[:, -1])
    opt.zero_grad()
    loss.backward()
    opt.step()


def feed_of(paths: list[str], batch: int, num_workers: int):
    from workers.data.batches import GlobalBatches
    from workers.data.loader import MapFeed
    from workers.data.token_files import TokenShards
    from workers.spec import LoaderSpec

    return MapFeed(GlobalBatches(TokenShards(paths, "uint16", SEQ, 65536), batch, 0),
                   LoaderSpec(num_workers=num_workers, prefetch_factor=4), torch.device("cpu"), 0, 1, batch)


def batches(mode: str, paths: list[str], batch: int):
    """An endless iterator of (x, y) global batches for the mode."""
    if mode == "plain":
        loader = torch.utils.data.DataLoader(PlainWindows(paths), batch_size=batch, shuffle=True, num_workers=2,
                                             drop_last=True, persistent_workers=True)
        while True:
            yield from loader
    feed = feed_of(paths, batch, int(mode))
    step = 0
    while True:
        [b] = feed.micro_batches(step)
        step += 1
        yield b


def throughput(mode: str, paths: list[str], batch: int, steps: int) -> dict:
    torch.set_num_threads(1)
    model, opt = mlp()
    it = batches(mode, paths, batch)
    t0 = 0.0
    for s in range(steps + 5):
        if s == 5:
            t0 = time.perf_counter()
        x, y = next(it)
        train_step(model, opt, x, y)
    return {"samples_per_s": steps * batch / (time.perf_counter() - t0)}


def memory(paths: list[str], batch: int, steps: int) -> dict:
    peak_anon = [0]
    stop = threading.Event()

    peak_worker_anon = [0]

    def sample() -> None:
        while not stop.is_set():
            peak_anon[0] = max(peak_anon[0], anon_bytes(os.getpid()))
            for child in children(os.getpid()):
                peak_worker_anon[0] = max(peak_worker_anon[0], anon_bytes(child))
            time.sleep(0.01)

    threading.Thread(target=sample, daemon=True).start()
    torch.set_num_threads(1)
    model, opt = mlp()
    feed = feed_of(paths, batch, 2)
    for step in range(steps):
        [(x, y)] = feed.micro_batches(step)
        train_step(model, opt, x, y)
    stop.set()
    feed.close()  # joins the workers: their peak RSS is then the children's
    return {"rank_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "worker_maxrss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
            "rank_anon_peak": peak_anon[0], "worker_anon_peak": peak_worker_anon[0]}


def anon_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass  # the process has just ended
    return 0


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def write_shards(directory: Path, shards: int, tokens_per_shard: int) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for i in range(shards):
        p = directory / f"train-{i:03d}.bin"
        rng.integers(0, 256, tokens_per_shard, dtype=np.uint16).tofile(p)
        paths.append(str(p))
    return paths


def child(kind: str, mode: str, paths: list[str], batch: int, steps: int) -> dict:
    """One measurement in a fresh interpreter (no state, no memory carried over)."""
    cmd = [sys.executable, __file__, "--child", json.dumps({"kind": kind, "mode": mode, "paths": paths,
                                                            "batch": batch, "steps": steps})]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        job = json.loads(args.child)
        run = throughput if job["kind"] == "throughput" else memory
        print(json.dumps(run(job["mode"], job["paths"], job["batch"], job["steps"]) if run is throughput
                         else run(job["paths"], job["batch"], job["steps"])))
        return
    row_bytes = (SEQ + 1) * 2
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_shards(Path(tmp) / "speed", args.shards, 200 * (SEQ + 1))
        modes = ["plain", "0", "1", "2"]
        results: dict[str, list[float]] = {m: [] for m in modes}
        for rep in range(2):  # interleaved: a busy moment hurts every mode alike
            for m in modes:
                results[m].append(child("throughput", m, paths, args.batch, args.steps)["samples_per_s"])
        plain = max(results["plain"])
        names = {"plain": "plain PyTorch DataLoader (num_workers 2)", "0": "trainyard num_workers 0",
                 "1": "trainyard num_workers 1", "2": "trainyard num_workers 2"}
        print(f"Throughput: MLP over {SEQ}-token rows, batch {args.batch}, {args.steps} steps, best of 2; "
              f"{args.shards} shards of {200 * row_bytes / 1e6:.1f} MB; torch threads 1\n")
        print_markdown_table(("loader", "samples/s", "vs plain DataLoader"),
                             [(names[m], f"{max(results[m]):.0f}", f"{max(results[m]) / plain:.2f}x") for m in modes])
        in_flight = 2 * 4 * args.batch * row_bytes  # num_workers x prefetch_factor micro-batches
        rows = []
        for factor in (10, 100, 1000):
            size = factor * in_flight
            shard_tokens = size // 2 // 8
            mpaths = write_shards(Path(tmp) / f"mem{factor}", 8, shard_tokens)
            mem = child("memory", "2", mpaths, args.batch, args.steps)
            rows.append((f"{factor}x ({size / 1e6:.0f} MB)", f"{mem['rank_maxrss'] / 2**20:.0f}",
                         f"{mem['rank_anon_peak'] / 2**20:.0f}", f"{mem['worker_maxrss'] / 2**20:.0f}",
                         f"{mem['worker_anon_peak'] / 2**20:.0f}"))
            for p in mpaths:
                os.remove(p)
        print(f"\nMemory: one rank, num_workers 2, prefetch_factor 4, {args.steps} steps of {args.batch} rows; "
              f"the loader holds {in_flight / 1e6:.1f} MB in flight\n")
        print_markdown_table(("dataset (x what the loader holds)", "rank peak RSS MiB", "rank peak anon MiB",
                              "worker peak RSS MiB", "worker peak anon MiB"), rows)


if __name__ == "__main__":
    main()
