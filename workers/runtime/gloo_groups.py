"""The gloo groups a rank makes beside its default group, connected lazily: a pair of ranks connects on
the first message between them, not all pairs when the group is made.

A gloo group made eagerly connects every rank to every other (4,095 connections per rank, 8.4 million
in all, at 4,096 ranks) for each group. The two it makes beside the default group carry small host
values only: the control group (workers/parallel/control_group.py: agreement flags, barriers, the
validation sum, replica digests) and the checkpoint group (workers/checkpointing/saver.py: DCP's plan
gather and the upload agreement, on the save's own thread, so it cannot share the control group).
Their collectives touch few peers: an all-reduce or all-gather (a ring) 2, a barrier about
2·log2(n), a gather to rank 0 one (rank 0: all). Measured on 8 gloo ranks (docs/scale.md): eager 7
connections per rank at creation; lazy 0, then 2 after an all-reduce, 5 after a barrier.

TORCH_GLOO_LAZY_INIT is read when a group is made: it is set for that moment only, so the default
group (the data path on CPU) stays as torch makes it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch.distributed as dist

LAZY_ENV = "TORCH_GLOO_LAZY_INIT"


@contextmanager
def lazily_connected() -> Iterator[None]:
    """Gloo groups made inside connect pairs on first use."""
    before = os.environ.get(LAZY_ENV)
    os.environ[LAZY_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(LAZY_ENV, None)
        else:
            os.environ[LAZY_ENV] = before


def lazy_gloo_group() -> dist.ProcessGroup:
    """A gloo group of every rank, connected lazily (a collective: every rank calls it, same order)."""
    with lazily_connected():
        group = dist.new_group(backend="gloo")
    assert group is not None
    return group
