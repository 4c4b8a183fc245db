"""The control and checkpoint groups connect lazily (workers/runtime/gloo_groups.py): made, they hold no
connection; an all-reduce connects a rank to its two ring neighbours, not to every rank; a mesh
dimension that spans every rank reuses the control group instead of making a second all-rank group.
Four real gloo ranks in spawned processes (no Ray); connections counted from /proc."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tests.workers.gloo_ranks import spawn_ranks
from tests.workers.socket_count import established_connections


def _groups(rank, world, port, queue):
    from workers.parallel.control_group import ControlGroups
    from workers.runtime.gloo_groups import lazy_gloo_group
    from workers.spec.dims import ParallelDims

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    dist.barrier()
    before = established_connections()
    control = ControlGroups()
    checkpoint = lazy_gloo_group()
    same = control.mirror(ParallelDims(dp_replicate=world), "dp") is control.world
    made = established_connections() - before
    total = control.all_reduce(torch.ones(1))
    reduced = established_connections() - before
    dist.all_reduce(torch.ones(1), group=checkpoint)
    dist.barrier()
    queue.put((rank, made, reduced, same, float(total.item()), len(control.groups())))
    dist.destroy_process_group()


@pytest.mark.exhaustive  # four spawned ranks: ~35 s on a loaded 2-core host (the audit covers the groups)
def test_control_groups_connect_on_use_and_a_full_dp_mirror_is_the_control_group():
    for rank, made, reduced, same, total, groups in spawn_ranks(_groups, 4):
        assert made == 0, (rank, made)  # eager gloo: 3 each (every other rank)
        assert reduced <= 2, (rank, reduced)  # the ring's two neighbours
        assert same and groups == 1 and total == 4.0, rank
