"""Expert parallelism for Hugging Face MoE layers (Mixtral, Qwen3-MoE): the experts module's stacked weights
sliced over the ep ranks and its forward replaced by an all-to-all dispatch.

transformers' own expert parallelism (`base_model_ep_plan`, `distributed_config`) shards at load time under
its tensor-parallel plan and keeps plain local tensors; we need the slices as DTensors Shard(0) over the job's
ep mesh (checkpoints and AdamW state reshard between ep degrees, DDP leaves them) and the dispatch the
built-in GPT's MoE already uses, so we slice and dispatch ourselves, in place: parameter names are
unchanged (`...mlp.experts.gate_up_proj`), only the instance's `forward` is overridden.

The router stays replicated and routes this rank's own tokens; the block's forward calls the experts
module with (hidden [T, d], top_k_index [T, k], top_k_weights [T, k]) as before.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from workers.models.hf_moe import HFExpertsRunner, check_layout, experts_field, hf_experts_modules, track_hf_moe
from workers.parallel.expert_dispatch import ExpertParallelDispatch


def _ep_forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
    """The experts module's forward under expert parallelism (bound to the module as `forward`)."""
    k = top_k_index.shape[-1]
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)  # (token, slot) assignments, global-expert-major
    counts = torch.bincount(flat, minlength=self.num_experts)
    token = order // k
    ys = self.ep_dispatch(HFExpertsRunner(self), hidden_states[token], counts)
    weighted = ys * top_k_weights.reshape(-1)[order].unsqueeze(-1).to(ys.dtype)
    return torch.zeros_like(hidden_states).index_add(0, token, weighted.to(hidden_states.dtype))


def apply_hf_expert_parallel(model: nn.Module, ep_mesh: DeviceMesh) -> list[Any]:
    """Slice every HF experts module of `model` over `ep_mesh` and dispatch by all-to-all; returns the
    modules (none: not an HF MoE model)."""

    group = ep_mesh.get_group()
    ep, rank = dist.get_world_size(group), dist.get_rank(group)
    layers = [experts for experts, _ in hf_experts_modules(model)]
    for experts in layers:
        check_layout(experts)
        total = experts.num_experts
        if total % ep:
            field = experts_field(experts.config)
            raise ValueError(f"model.hf.config.{field} must be divisible by parallel.ep "
                             f"(model.hf.config.{field}={total}, parallel.ep={ep})")
        if isinstance(experts.gate_up_proj, DTensor):
            raise ValueError("apply_expert_parallel: the model's experts are sharded already")
        local = total // ep
        lo = rank * local
        for name in ("gate_up_proj", "down_proj"):
            full = getattr(experts, name)
            mine = DTensor.from_local(full.detach()[lo:lo + local].clone(), ep_mesh, [Shard(0)], run_check=False)
            setattr(experts, name, nn.Parameter(mine, requires_grad=full.requires_grad))
        experts.expert_offset = lo
        experts.ep_dispatch = ExpertParallelDispatch(group, ep, rank)
        experts.forward = types.MethodType(_ep_forward, experts)
    track_hf_moe(model)  # tokens_per_expert and the router logits, as without ep
    return layers
