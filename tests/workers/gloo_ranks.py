"""Run a function on real gloo ranks in spawned processes (no Ray): each rank puts its result on a queue."""

from __future__ import annotations

import os
import socket

import torch.multiprocessing as mp


def rank_main(rank, fn, world, port, queue, finished, *args):
    """Run one rank's `fn`, hand what it queued over, wait until every rank has, and leave without the
    interpreter's teardown: gloo's threads at that teardown sometimes abort the process ("terminate
    called without an active exception", about 1 run in 5 of the tensor-parallel cases here) after
    the rank's work is done.

    The wait: rank 0 hosts the rendezvous store, and a rank that is done with its collectives may
    still ask the store for something (a group of its own, made after the last one it shares): rank 0
    leaving first broke that rank's connection to the store (a loaded host, CI: "Connection reset by
    peer" in `new_group`)."""
    fn(rank, world, port, queue, *args)
    queue.close()
    queue.join_thread()  # what this rank put is in the pipe
    finished.wait(timeout=240)  # a rank that failed meanwhile fails the test through its own exit
    os._exit(0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(fn, world: int, *args, results: int | None = None) -> list:
    """`fn(rank, world, port, queue, *args)` on `world` processes; their queued results (`results` of
    them, every rank's by default), sorted."""
    ctx = mp.get_context("spawn")
    queue, finished = ctx.Queue(), ctx.Barrier(world)
    mp.start_processes(rank_main, args=(fn, world, _free_port(), queue, finished, *args), nprocs=world,
                       start_method="spawn")
    # a loaded 2-core host starts ranks slowly
    return sorted(queue.get(timeout=240) for _ in range(world if results is None else results))
