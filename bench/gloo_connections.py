"""TCP connections a rank holds for one all-rank gloo group, made eagerly (torch's default) or lazily
(workers/runtime/gloo_groups.py, the control and checkpoint groups), after each kind of collective the
control path issues.

    .venv/bin/python bench/gloo_connections.py [--ranks 8]

`--ranks` gloo processes (spawned, no Ray); connections counted from /proc (ESTABLISHED sockets of the
process, less those it held before the group was made). Per column, the maximum over ranks and the
median; rank 0 is the gather's root (every rank sends to it).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from bench.table import print_markdown_table  # noqa: E402
from tests.workers.socket_count import established_connections  # noqa: E402
from workers.runtime.gloo_groups import lazy_gloo_group  # noqa: E402

STAGES = ("made", "all_reduce", "all_gather_object", "barrier", "gather_object to 0")


def rank_main(rank: int, world: int, port: int, lazy: bool, queue) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    dist.barrier()
    before = established_connections()
    group = lazy_gloo_group() if lazy else dist.new_group(backend="gloo")
    seen = [established_connections() - before]
    dist.all_reduce(torch.ones(1), group=group)
    seen.append(established_connections() - before)
    dist.all_gather_object([None] * world, rank, group=group)
    seen.append(established_connections() - before)
    dist.barrier(group=group)
    seen.append(established_connections() - before)
    dist.gather_object(rank, [None] * world if rank == 0 else None, dst=0, group=group)
    seen.append(established_connections() - before)
    queue.put((rank, seen))
    dist.barrier()
    dist.destroy_process_group()


def measure(world: int, lazy: bool) -> list[list[int]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = mp.get_context("spawn").Queue()
    mp.start_processes(rank_main, args=(world, port, lazy, queue), nprocs=world, start_method="spawn")
    return [seen for _, seen in sorted(queue.get(timeout=300) for _ in range(world))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rows = []
    for lazy in (False, True):
        per_rank = measure(args.ranks, lazy)
        for i, stage in enumerate(STAGES):
            col = [seen[i] for seen in per_rank]
            rows.append(["lazy" if lazy else "eager", stage, str(max(col)), str(statistics.median(col))])
    print(f"\n{args.ranks} ranks: connections per rank after each collective (cumulative)\n")
    print_markdown_table(["group", "after", "max over ranks", "median"], rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
