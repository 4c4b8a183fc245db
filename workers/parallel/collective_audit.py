"""Which group and which device every collective of a run used, checked against the rule of
workers/parallel/control_group.py (docs/parallel.md, "Which group a collective uses").

A TorchDispatchMode (like metering.py's) sees every c10d and functional-collective op issued in
its thread. For each it records the group, the devices of its tensors and its site: the innermost
frame in Trainyard's own code (model code counts as one site, `workers.models`), which says what
the collective is for. Each site is declared below as data or control; a run then violates the rule
when a collective comes from an undeclared site, goes through a group of the other kind, or carries
tensors off its kind's device (data: the rank's device; control: the CPU). On CPU the devices agree
whatever the code does, so the site table is what makes the check bite there: a host value sent to
a data group from a control site fails on CPU as it would fail under NCCL.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

DATA, CONTROL = "data", "control"

# Every site that issues a collective, by what it carries (reviewed by reading each call; see docs/parallel.md).
SITES: dict[str, str] = {
    # The CPU groups' own methods: agreement, digests, makespans, reported losses, barriers.
    "workers.parallel.control_group:ControlGroups.all_reduce": CONTROL,
    "workers.parallel.control_group:ControlGroups.all_gather": CONTROL,
    "workers.parallel.control_group:ControlGroups.all_gather_object": CONTROL,
    "workers.parallel.control_group:ControlGroups.barrier": CONTROL,
    # DCP's async save plans on the checkpointer's own gloo group (host state, a background writer).
    "workers.checkpointing.saver:Checkpointer.save": CONTROL,
    # On an object store the ranks agree on the checkpoint group whether every upload went through.
    "workers.checkpointing.staging:StagedUpload._upload": CONTROL,
    "workers.training.validation:validate": CONTROL,  # the loss sums over dp, CPU mirror of dp
    # Gradients, parameters, activations, the gradient norm, model state: the rank's device.
    "workers.models": DATA,  # DTensor ops inside a tensor-parallel model's forward
    "workers.model_io:call_model": DATA,  # FSDP's all-gathers before a forward (evaluation)
    "workers.parallel.base:accumulate": DATA,  # FSDP / TP backward hooks under loss.backward()
    "workers.parallel.data_parallel.shard:sharded_forward_backward": DATA,
    "workers.parallel.data_parallel.reducers:DDPReducer.wrap": DATA,  # DDP's initial parameter broadcast
    "workers.parallel.compression:plain_hook": DATA,
    "workers.parallel.compression:_cast_hook.<locals>.hook": DATA,
    "workers.parallel.compression:powersgd_hook": DATA,
    "workers.parallel.sign_compression:sign_hook": DATA,  # onebit/signsgd: all-gather of packed signs
    # parallel.collectives 'hierarchical': on the hook's own thread, over its intra- and cross-node groups
    "workers.parallel.hierarchical:_even": DATA,
    "workers.parallel.hierarchical:_through_leaders": DATA,
    "workers.parallel.hierarchical:HierarchicalGroups.__init__": DATA,  # new_group's store barrier, if any
    "workers.parallel.common:global_grad_norm_clip": DATA,
    "workers.parallel.common:average_in_place": DATA,
    "workers.parallel.common:reduce_partial_grads": DATA,
    "workers.parallel.zero_optimizer:ShardedAdamW._reduce_scatter": DATA,  # also from ZeRO-2's backward hooks
    "workers.parallel.zero_optimizer:ShardedAdamW._all_reduce_scalar_grads": DATA,
    "workers.parallel.zero_optimizer:ShardedAdamW.clip_grad_norm": DATA,
    "workers.parallel.zero_optimizer:ShardedAdamW._all_gather_params": DATA,
    "workers.parallel.data_parallel.reducers:average_over_dp": DATA,  # tp shards' local pieces over dp
    "workers.parallel.tensor_plan:apply_tensor_plan": DATA,  # distribute_tensor: rank 0's weights, scattered
    "workers.parallel.pipeline.strategy:PipelineStrategy.forward_backward": DATA,
    "workers.parallel.pipeline.stage_meter:StageMeter._timed_p2p.<locals>.timed": DATA,  # the schedule's p2p
    "workers.parallel.pipeline.strategy:PipelineStrategy.clip_grad_norm": DATA,
    "workers.parallel.pipeline.chimera:_Links.send": DATA,  # chimera's activations and input gradients
    "workers.parallel.pipeline.chimera:_Links._issue_up_to": DATA,  # ... received
    "workers.parallel.pipeline.async_1f1b:AsyncPipelineStrategy._post": DATA,  # pipedream*'s paired p2p
    "workers.parallel.pipeline.strategy:PipelineRank.forward": DATA,  # evaluation across the stages
    "workers.parallel.pipeline.strategy:PipelineStrategy.full_model_state": DATA,  # TP shards' full_tensor
    "workers.parallel.sdp.sync:HolderSync.average": DATA,
    "workers.parallel.sdp.sync:HolderSync.refresh_unheld": DATA,
    "workers.parallel.sdp.sync:HolderSync.grad_norm_clip": DATA,
    "workers.parallel.sdp.sync:HolderSync.full_state": DATA,
    "workers.parallel.sdp.strategy:SDPStrategy.full_model_state": DATA,
    "workers.checkpointing.export:full_model_state": DATA,  # the export gathers DTensor shards
}
_SKIP = {__name__, "workers.parallel.metering", "workers.storage_tracker", "workers.step_memory"}  # instrumentation


@dataclass(frozen=True)
class Collective:
    op: str
    group: str  # the process group's name
    devices: tuple[str, ...]  # device types of the tensors it carries
    site: str


def _site() -> str:
    frame = sys._getframe(2)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith("workers.") and module not in _SKIP:
            return "workers.models" if module.startswith("workers.models") else f"{module}:{frame.f_code.co_qualname}"
        frame = frame.f_back  # type: ignore[assignment]
    return "outside workers"


def _tensors(x) -> list[torch.Tensor]:
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    return [x] if torch.is_tensor(x) else []


def _group_name(args) -> str:
    for a in args:
        if isinstance(a, torch.ScriptObject):
            return dist.ProcessGroup.unbox(a).group_name
    names = [a for a in args if isinstance(a, str)]  # functional collectives name their group
    return names[-1] if names else "?"


class CollectiveRecorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Collective] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace in ("c10d", "_c10d_functional") and not func._opname.startswith("wait"):
            devices = tuple(sorted({t.device.type for t in _tensors(list(args) + list(kwargs.values()))}))
            self.seen.append(Collective(f"{func.namespace}.{func._opname}", _group_name(args), devices, _site()))
        return func(*args, **kwargs)


def violations(seen: list[Collective], device: torch.device, cpu_groups: set[str]) -> list[str]:
    """What breaks the rule: `cpu_groups` are the names of the control (and checkpoint) groups."""
    found = []
    for c in seen:
        kind = SITES.get(c.site)
        on_cpu_group = c.group in cpu_groups
        expected = "cpu" if kind == CONTROL else device.type
        if kind is None:
            found.append(f"{c.op} from an undeclared site {c.site} (declare it in collective_audit.SITES)")
        elif on_cpu_group != (kind == CONTROL):
            found.append(f"{c.op} from {c.site} ({kind}) went through the {'CPU' if on_cpu_group else 'data'} "
                         f"group {c.group}")
        elif any(d != expected for d in c.devices):
            found.append(f"{c.op} from {c.site} ({kind}) carried tensors on {c.devices}, not {expected}")
    return found
