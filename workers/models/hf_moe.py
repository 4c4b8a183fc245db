"""Hugging Face MoE layers (Mixtral, Qwen3-MoE, ...): finding their experts, running them, and their telemetry.

transformers keeps a sparse block's experts as one module with stacked weights (`gate_up_proj [E, 2I, d]`,
`down_proj [E, d, I]`) whose forward takes (hidden [T, d], top_k_index [T, k], top_k_weights [T, k]) from
the block's router (`block.gate`, returning (router_logits, top_k_weights, top_k_index)). The config's
`base_model_ep_plan` names exactly these modules (`layers.*.mlp.experts`); we find them by that shape, which
also covers architectures whose plan we do not read.

Telemetry, after each forward of an experts module (hooks, so the model's own forward is untouched):
  `tokens_per_expert`: [E] int64, this process's (token, slot) assignments per global expert (sums to
    tokens * top_k), as `MoE.tokens_per_expert` for the built-in GPT.
  `router_logits`: the block's router logits [T, E] (in the autograd graph).

The load-balancing loss (`hf_aux_loss`) is transformers' own `load_balancing_loss_func` on those logits:
counts and router probabilities pooled over all MoE layers, E * sum_e f_e * P_e, weighted by the config's
`router_aux_loss_coef`. We recompute it from the recorded logits rather than asking the model for it
(`output_router_logits=True`) because then the model returns it only beside its own loss, while a job's
`train.loss` (e.g. cross_entropy) is computed outside the model: this way any loss gets it, and the value is
the one the model would have added. Not reproduced: the padding mask transformers may apply (every position
counts), which is the model's own behaviour when it is called without an attention_mask.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn import functional as F


# HF modules are typed `Any` here: their attributes (num_experts, config, gate_up_proj...) are duck-typed.
def is_hf_experts(m: Any) -> bool:
    """A transformers stacked-experts module (what `base_model_ep_plan` calls `...experts`)."""
    return (isinstance(getattr(m, "gate_up_proj", None), nn.Parameter) and m.gate_up_proj.dim() == 3
            and isinstance(getattr(m, "down_proj", None), nn.Parameter) and m.down_proj.dim() == 3
            and hasattr(m, "num_experts") and hasattr(m, "config"))


def hf_experts_modules(model: nn.Module) -> list[tuple[Any, Any]]:
    """(experts, their sparse block) for every HF MoE layer of `model`, in module order."""
    found = []
    for block in model.modules():
        experts = getattr(block, "experts", None)
        if isinstance(experts, nn.Module) and is_hf_experts(experts):
            found.append((experts, block))
    return found


def experts_field(config) -> str:
    """The config field a user sets for the number of experts (Mixtral: num_local_experts, Qwen3-MoE:
    num_experts; transformers aliases one to the other, so read the config class's own signature)."""
    params = inspect.signature(type(config).__init__).parameters
    return "num_experts" if "num_experts" in params else "num_local_experts"


def check_layout(experts: Any) -> None:
    """We run the experts ourselves: only the layout Mixtral and Qwen3-MoE use (gate and up concatenated,
    [out, in] weights, no biases) is supported; anything else would silently compute something else."""
    if (getattr(experts, "is_transposed", False) or getattr(experts, "has_bias", False)
            or not getattr(experts, "has_gate", True) or not getattr(experts, "is_concatenated", True)
            or getattr(experts, "has_post_expert_norm", False)):
        raise ValueError(f"{type(experts).__name__}: only concatenated gate/up experts without biases, transpose "
                         f"or post-expert norm are supported by Trainyard's expert parallelism")


def _local(w: torch.Tensor) -> torch.Tensor:
    return w.to_local() if isinstance(w, DTensor) else w


class HFExpertsRunner:
    """An HF experts module seen through the built-in MoE's dispatch protocol (`local_experts`, `run_experts`),
    so ExpertParallelDispatch moves its tokens unchanged."""

    def __init__(self, experts: Any):
        self.experts = experts

    @property
    def local_experts(self) -> int:
        return _local(self.experts.gate_up_proj).shape[0]

    def run_experts(self, xs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Rows xs grouped by local expert (`counts`); the HF expert MLP: down(act(gate) * up). Every expert
        runs, on zero rows too, so every rank's backward reaches the same all-to-alls."""
        m = self.experts
        # in the rows' dtype: FSDP's mixed precision casts the parameters it holds, not the expert shards it leaves
        gate_up, down = _local(m.gate_up_proj).to(xs.dtype), _local(m.down_proj).to(xs.dtype)
        outs = []
        for e, c in enumerate(torch.split(xs, counts.tolist())):
            h = F.linear(c, gate_up[e])
            h = m._apply_gate(h) if hasattr(m, "_apply_gate") else _gate(m, h)
            outs.append(F.linear(h, down[e]))
        return torch.cat(outs)


def _gate(m: Any, h: torch.Tensor) -> torch.Tensor:
    gate, up = h.chunk(2, dim=-1)
    return m.act_fn(gate) * up


def _record_tokens(experts: Any, args, kwargs) -> None:
    index = args[1] if len(args) > 1 else kwargs["top_k_index"]
    experts.tokens_per_expert = torch.bincount(index.reshape(-1).detach(), minlength=experts.num_experts)


def _record_router(experts: Any):
    def hook(_gate_module, _args, output) -> None:
        experts.router_logits = output[0] if isinstance(output, tuple) else output
    return hook


def track_hf_moe(model: nn.Module) -> list[Any]:
    """Install the telemetry hooks on every HF MoE layer (once; idempotent). Returns the experts modules."""
    layers = []
    for experts, block in hf_experts_modules(model):
        if not getattr(experts, "_trainyard_tracked", False):
            experts.tokens_per_expert = None
            experts.router_logits = None
            # a pre-hook: set before any forward hook (moe_telemetry's ExpertLoad, whenever registered) reads it
            experts.register_forward_pre_hook(_record_tokens, with_kwargs=True)
            if isinstance(getattr(block, "gate", None), nn.Module):
                block.gate.register_forward_hook(_record_router(experts))
            experts._trainyard_tracked = True
        layers.append(experts)
    return layers


def hf_aux_loss(layers: list[Any]) -> torch.Tensor:
    """router_aux_loss_coef * transformers' load_balancing_loss_func over the layers' last router logits."""
    if any(m.router_logits is None for m in layers):
        raise RuntimeError("hf_aux_loss: an HF MoE layer has not run a forward yet (or its block has no router)")
    config = layers[0].config
    num_experts, top_k = layers[0].num_experts, config.num_experts_per_tok
    logits = [m.router_logits for m in layers]
    dtype = torch.promote_types(logits[0].dtype, torch.float32)
    counts = torch.zeros(num_experts, dtype=dtype, device=logits[0].device)
    probs_sum = torch.zeros_like(counts)
    rows = 0
    for layer_logits in logits:
        probs = layer_logits.to(dtype).softmax(-1)
        _, chosen = probs.topk(top_k, dim=-1)
        # f_e counts top-k assignments per row (carries no gradient); P_e is the mean probability
        counts = counts + torch.bincount(chosen.reshape(-1), minlength=num_experts).to(dtype)
        probs_sum = probs_sum + probs.sum(0)
        rows += probs.shape[0]
    return config.router_aux_loss_coef * num_experts * ((counts / rows) * (probs_sum / rows)).sum()
