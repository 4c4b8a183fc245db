"""Run a function on real gloo ranks in spawned processes (no Ray): each rank puts its result on a queue."""

from __future__ import annotations

import os
import socket

import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessRaisedException


def rank_main(rank, fn, world, port, queue, *args):
    """Run one rank's `fn`, hand what it queued over, and leave without the interpreter's teardown:
    gloo's threads at that teardown sometimes abort the process ("terminate called without an active
    exception", about 1 run in 5 of the tensor-parallel cases here) after the rank's work is done."""
    fn(rank, world, port, queue, *args)
    queue.close()
    queue.join_thread()  # what this rank put is in the pipe
    os._exit(0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(fn, world: int, *args, results: int | None = None) -> list:
    """`fn(rank, world, port, queue, *args)` on `world` processes; their queued results (`results` of
    them, every rank's by default), sorted.

    A gloo connection broken while the ranks form their groups (DistNetworkError: a loaded host's
    loopback, seen once in a CI run of hundreds of these) starts the ranks once more on a fresh port
    and queue; any other failure, and a second broken connection, fails the test."""
    for attempt in (1, 2):
        queue = mp.get_context("spawn").Queue()
        try:
            mp.start_processes(rank_main, args=(fn, world, _free_port(), queue, *args), nprocs=world,
                               start_method="spawn")
        except ProcessRaisedException as e:
            if attempt == 2 or "DistNetworkError" not in str(e):
                raise
            continue
        # a loaded 2-core host starts ranks slowly
        return sorted(queue.get(timeout=240) for _ in range(world if results is None else results))
    raise AssertionError("unreachable")
