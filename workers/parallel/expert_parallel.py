"""Expert parallelism: each MoE layer's experts sharded over a process group, tokens moved by all-to-all.

Every rank of the ep group runs its own micro-batch (as in data parallelism). A rank routes its tokens
locally (router replicated, capacity applied to its own tokens), sends each assignment to the rank that
owns its expert, runs its own experts on what it receives, and sends the results back to be combined
with the gates. Gradients follow the same path back (the all-to-all's backward is the reverse
all-to-all), so an expert's gradient lands on its owner, summed over every rank's tokens.

The caller's part: the non-expert parameters are replicated, so their gradients must be all-reduced over
the group (as DDP would); the expert parameters (`expert_parameters`) are local and must not be, but
scaled the same way (divided by the group size when the shared ones are averaged).

Hugging Face MoE models (Mixtral, Qwen3-MoE: stacked `gate_up_proj`/`down_proj` experts modules) take the
same dispatch; see workers/parallel/expert_parallel_hf.py.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from workers.models.hf_moe import hf_experts_modules
from workers.models.moe import MoE
from workers.parallel.expert_dispatch import ExpertParallelDispatch
from workers.parallel.layouts.accounting import ring


def expert_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters each ep rank holds its own slice of (their gradients are not all-reduced).
    The built-in MoE's expert weights always (the planner counts them on the unsharded model); an HF MoE
    model's only once `apply_expert_parallel` sharded them: DDP leaves whatever this returns to the ep
    reduction, which runs only under ep > 1, so an unsharded HF model's experts must stay DDP's."""
    own: list[nn.Parameter] = [p for m in model.modules() if isinstance(m, MoE) for p in (m.w1, m.b1, m.w2, m.b2)]
    hf = [p for m, _ in hf_experts_modules(model) if isinstance(getattr(m, "ep_dispatch", None), ExpertParallelDispatch)
          for p in (m.gate_up_proj, m.down_proj)]
    return own + hf


def apply_expert_parallel(model: nn.Module, ep_mesh: DeviceMesh) -> nn.Module:
    """Keep this rank's slice of every MoE layer's experts and dispatch tokens over the ep ranks, in place.
    The slices become DTensors sharded on dim 0 over `ep_mesh`, so a checkpoint (weights and AdamW state)
    saves every expert once and loads under another ep degree.

    Every rank must have built the same full model (same seed) before: the slices are its parameters.
    Build the optimizer afterwards (the expert parameters are replaced)."""
    group = ep_mesh.get_group()
    ep, rank = dist.get_world_size(group), dist.get_rank(group)
    layers = [m for m in model.modules() if isinstance(m, MoE)]
    if not layers and hf_experts_modules(model):
        from workers.parallel.expert_parallel_hf import apply_hf_expert_parallel

        apply_hf_expert_parallel(model, ep_mesh)
        return model
    if not layers:
        raise ValueError("apply_expert_parallel: the model has no MoE layer (set model.moe, or an HF MoE model)")
    for moe in layers:
        if moe.experts % ep:
            raise ValueError(f"model.moe.experts must be divisible by parallel.ep "
                             f"(model.moe.experts={moe.experts}, parallel.ep={ep})")
        if moe.local_experts != moe.experts:
            raise ValueError("apply_expert_parallel: the model's experts are sharded already")
        local = moe.experts // ep
        lo = rank * local
        for name in ("w1", "b1", "w2", "b2"):
            full = getattr(moe, name)
            mine = DTensor.from_local(full.detach()[lo:lo + local].clone(), ep_mesh, [Shard(0)], run_check=False)
            setattr(moe, name, nn.Parameter(mine, requires_grad=full.requires_grad))
        moe.expert_offset = lo
        moe.dispatch = ExpertParallelDispatch(group, ep, rank)
    return model


def sharded_experts(model: nn.Module) -> list[nn.Parameter]:
    """The expert parameters expert parallelism sharded (DTensors over ep); without it experts are whole on
    every rank and the data-parallel step reduces them like any other parameter."""
    return [p for p in expert_parameters(model) if isinstance(p, DTensor)]


@torch.no_grad()
def reduce_expert_grads(wrapped: nn.Module, ctx) -> int:
    """An expert's gradient on its owner sums the contributions of every token its ep group sent it; the
    owners of the same shard in the other groups (`dp_mod_ep`, at the same tp coordinate) hold the rest.
    Summed over them and divided by dp, it is the data-parallel mean DDP, FSDP and tp's all-reduce take of
    the shared parameters. Returns the bytes the all-reduces moved (call it outside a comm meter)."""
    replicas, sent = ctx.mesh["dp_mod_ep"], 0.0
    for p in sharded_experts(wrapped):
        if p.grad is None:
            continue
        local = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
        if replicas.size() > 1:
            dist.all_reduce(local, group=replicas.get_group())
            sent += ring(replicas.size()) * local.numel() * local.element_size()
        local.div_(ctx.spec.dp)
    return int(sent)


def take_step_bytes(model: nn.Module) -> int:
    """Bytes this rank sent by all-to-all since the last take, forward and backward, all MoE layers (a
    recomputed forward under activation checkpointing sends again, and counts again)."""
    total = 0
    for d in _dispatches(model):
        total, d.step_bytes = total + d.step_bytes, 0
    return total


def all_to_all_bytes(model: nn.Module) -> int:
    """Bytes this rank sent to other ranks by all-to-all in the model's last forward, all MoE layers."""
    return sum(d.all_to_all_bytes for d in _dispatches(model))


def _dispatches(model: nn.Module) -> list[ExpertParallelDispatch]:
    found: list[Any] = [m.dispatch for m in model.modules() if isinstance(m, MoE)]
    found += [getattr(m, "ep_dispatch", None) for m, _ in hf_experts_modules(model)]
    return [d for d in found if isinstance(d, ExpertParallelDispatch)]
