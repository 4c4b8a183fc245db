"""Run a function on real gloo ranks in spawned processes (no Ray): each rank puts its result on a queue."""

from __future__ import annotations

import socket

import torch.multiprocessing as mp


def spawn_ranks(fn, world: int, *args) -> list:
    """`fn(rank, world, port, queue, *args)` on `world` processes; their queued results, sorted."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = mp.get_context("spawn").Queue()
    mp.start_processes(fn, args=(world, port, queue, *args), nprocs=world, start_method="spawn")
    return sorted(queue.get(timeout=240) for _ in range(world))  # a loaded 2-core host starts ranks slowly
