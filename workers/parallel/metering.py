"""Logical communication bytes of whatever collectives run inside a block of code.

Strategies built on FSDP2 or DTensor do not call collectives themselves, so a
TorchDispatchMode watches the c10d and functional-collective ops they issue
(forward and backward run in this thread on CPU and on CUDA's default setup)
and records what each collective is asked to move per rank, by the usual ring
accounting for a group of K ranks holding B bytes:
  all-reduce 2(K-1)/K x B, all-gather (K-1)/K x B of the output,
  reduce-scatter (K-1)/K x B of the input, broadcast B.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from workers.telemetry import CommMeter


def _nbytes(x) -> int:
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(t) for t in x)
    return x.numel() * x.element_size() if torch.is_tensor(x) else 0


def _group_size(group) -> int:
    if isinstance(group, str):
        from torch.distributed.distributed_c10d import GroupName, _resolve_process_group
        return _resolve_process_group(GroupName(group)).size()
    return dist.ProcessGroup.unbox(group).size()


# op name -> (index of the tensor(s) the bytes refer to, index of the group, factor as a function of K)
def _RING(k: int) -> float:
    return 2 * (k - 1) / k


def _ONE_PASS(k: int) -> float:
    return (k - 1) / k


_COLLECTIVES = {
    "c10d.allreduce_": (0, 1, _RING),
    "_c10d_functional.all_reduce": (0, 2, _RING),
    "_c10d_functional.all_reduce_": (0, 2, _RING),
    "c10d._allgather_base_": (0, 2, _ONE_PASS),
    "c10d.allgather_": (0, 2, _ONE_PASS),
    "_c10d_functional.all_gather_into_tensor": (0, 2, lambda k: k - 1),  # input is one shard
    "c10d._reduce_scatter_base_": (1, 2, _ONE_PASS),
    "c10d.reduce_scatter_": (1, 2, _ONE_PASS),
    "_c10d_functional.reduce_scatter_tensor": (0, 3, _ONE_PASS),
    "c10d.alltoall_base_": (1, 2, _ONE_PASS),
    "_c10d_functional.all_to_all_single": (0, 3, _ONE_PASS),
    "c10d.broadcast_": (0, 1, lambda k: 1.0),
    "_c10d_functional.broadcast": (0, 2, lambda k: 1.0),
}


_SELF_COUNTED = [0]  # depth of `counted_by_caller` blocks


@contextlib.contextmanager
def counted_by_caller():
    """Collectives whose caller counts its own bytes (expert parallelism's all-to-all counts the rows that
    leave the rank, in every layout): the meter leaves them out rather than count them twice."""
    _SELF_COUNTED[0] += 1
    try:
        yield
    finally:
        _SELF_COUNTED[0] -= 1


class CollectiveMeter(TorchDispatchMode):
    def __init__(self, meter: CommMeter):
        super().__init__()
        self.meter = meter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        collective = func.namespace in ("c10d", "_c10d_functional")
        rule = _COLLECTIVES.get(f"{func.namespace}.{func._opname}") if collective and not _SELF_COUNTED[0] else None
        if rule is not None:
            data, group, factor = rule
            k = _group_size(args[group])
            if k > 1:
                self.meter.launched(int(factor(k) * _nbytes(args[data])))
        return func(*args, **kwargs)


@contextlib.contextmanager
def metered(meter: CommMeter):
    """Record the logical bytes of every collective issued inside the block."""
    with CollectiveMeter(meter):
        yield
    meter.finished()


# torch.distributed's Python API -> (argument holding the bytes, factor as a function of K); the same
# accounting as the ops above (all_gather_single: its output; reduce_scatter_single: its input).
_CALLS = {"all_gather_single": ((0, "output_tensor"), _ONE_PASS), "reduce_scatter_single": ((1, "input"), _ONE_PASS),
          "all_reduce": ((0, "tensor"), _RING)}


@contextlib.contextmanager
def metered_calls(meter: CommMeter):
    """`metered` for code that issues its collectives through torch.distributed's Python functions
    (FSDP2 without tensor parallelism): only those calls are wrapped, so the step's other ops do not
    pass through Python (the dispatch mode cost about 4% of an FSDP step on CPU, bench/hf_models.py)."""
    originals = {name: getattr(dist, name) for name in _CALLS}

    def wrapped(name, original):
        (index, keyword), factor = _CALLS[name]

        def call(*args, **kwargs):
            k = dist.get_world_size(kwargs.get("group"))
            if k > 1:
                meter.launched(int(factor(k) * _nbytes(args[index] if len(args) > index else kwargs[keyword])))
            return original(*args, **kwargs)
        return call

    for name, original in originals.items():
        setattr(dist, name, wrapped(name, original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)
        meter.finished()
