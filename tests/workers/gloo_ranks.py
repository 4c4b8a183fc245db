"""Run a function on real gloo ranks in spawned processes (no Ray): each rank puts its result on a queue."""

from __future__ import annotations

import os
import socket

import torch.multiprocessing as mp


def rank_main(rank, fn, world, port, queue, *args):
    """Run one rank's `fn`, hand what it queued over, and leave without the interpreter's teardown:
    gloo's threads at that teardown sometimes abort the process ("terminate called without an active
    exception", about 1 run in 5 of the tensor-parallel cases here) after the rank's work is done."""
    fn(rank, world, port, queue, *args)
    queue.close()
    queue.join_thread()  # what this rank put is in the pipe
    os._exit(0)


def spawn_ranks(fn, world: int, *args) -> list:
    """`fn(rank, world, port, queue, *args)` on `world` processes; their queued results, sorted."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = mp.get_context("spawn").Queue()
    mp.start_processes(rank_main, args=(fn, world, port, queue, *args), nprocs=world, start_method="spawn")
    return sorted(queue.get(timeout=240) for _ in range(world))  # a loaded 2-core host starts ranks slowly
