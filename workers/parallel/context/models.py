"""Route a model's attention through the ring and give its positions the rank's global ones.

The contract (every rank of the cp group): the model receives this rank's shard of the token ids,
`shard_sequence(ids, 1, rank, cp)` (chunks r and 2cp-1-r, so its local length is seq_len / cp), and
returns logits for exactly those tokens. Targets must be shifted BEFORE sharding (the target of the last
token of chunk r is the first token of chunk r+1, which lives on another rank) and sharded the same way;
the loss then follows workers/parallel/context/loss.py. Every rank must run each forward and backward
together: attention exchanges keys/values (and their gradients) with the neighbouring cp ranks.

The models are changed in place, not wrapped, so their parameter names (checkpoints, TP plans) stay.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn

from workers.models.description import ModelDescription
from workers.parallel.context.chunking import sequence_positions
from workers.parallel.context.ring_attention import ring_attention

HF_ATTENTION = "trainyard_ring"  # the name the ring is registered under in transformers' AttentionInterface

# attention module -> its cp group, for the HF attention function (which transformers calls with the module)
_HF_GROUPS: weakref.WeakKeyDictionary[nn.Module, dist.ProcessGroup | None] = weakref.WeakKeyDictionary()


def apply_context_parallel(model: nn.Module, description: ModelDescription,
                           group: dist.ProcessGroup | None = None) -> nn.Module:
    """Make `model` (the built-in GPT or a transformers causal LM such as Llama) run on one rank's shard of the
    sequence, `group` being the cp ranks (None: the default group). Returns the same model."""
    from workers.models.gpt import GPT

    if isinstance(model, GPT):
        _apply_gpt(model, description, group)
    elif hasattr(getattr(model, "config", None), "_attn_implementation"):
        _apply_hf(model, description, group)
    else:
        raise ValueError(f"context parallelism supports the built-in GPT and transformers causal LMs, not "
                         f"{type(model).__name__}")
    return model


def _local_to_global(length: int, group, device) -> torch.Tensor:
    rank, cp = dist.get_rank(group), dist.get_world_size(group)
    return sequence_positions(length * cp, rank, cp, device)


# --- the built-in GPT (workers/models/gpt.py) ------------------------------------------------------------

def _gpt_ring_forward(attn: Any, x: torch.Tensor, *, group) -> torch.Tensor:  # a CausalSelfAttention
    """CausalSelfAttention.forward with the ring in place of scaled_dot_product_attention."""
    b, t, _ = x.shape
    q, k, v = (proj(x).view(b, t, -1, attn.head_dim).transpose(1, 2) for proj in (attn.q, attn.k, attn.v))
    y = ring_attention(q, k, v, group)
    return attn.proj(y.transpose(1, 2).reshape(b, t, -1))


def _apply_gpt(model: nn.Module, description: ModelDescription, group) -> None:
    from workers.models.gpt import CausalSelfAttention

    for block in description.blocks(model):
        attn = getattr(block, "attn", None)
        if not isinstance(attn, CausalSelfAttention):
            raise ValueError(f"context parallelism expects GPT blocks with a CausalSelfAttention `attn`, got "
                             f"{type(attn).__name__}")
        if attn.dropout:
            raise ValueError(f"context parallelism needs model.dropout 0 (got {attn.dropout}): ring attention "
                             f"does not drop attention weights")
        attn.forward = functools.partial(_gpt_ring_forward, attn, group=group)  # type: ignore[method-assign]

    def global_positions(module: nn.Embedding, args):
        # GPT.forward embeds arange(local length); the rank's tokens sit at other global positions
        (local,) = args
        positions = _local_to_global(local.shape[0], group, local.device)
        if positions.numel() and int(positions.max()) >= module.num_embeddings:
            raise ValueError(f"the sharded sequence ({local.shape[0]} tokens x cp {dist.get_world_size(group)}) "
                             f"is longer than the model's {module.num_embeddings} positions (data.seq_len)")
        return (positions,)

    cast(nn.Module, model.pos_emb).register_forward_pre_hook(global_positions)


# --- transformers causal LMs (Llama family) -------------------------------------------------------------

def _hf_ring_attention(module: nn.Module, query, key, value, attention_mask, dropout: float = 0.0,
                       scaling: float | None = None, **kwargs):
    """transformers' attention-function signature: q, k, v [b, heads, t, d] after rotary; returns the
    output as [b, t, heads, d] and no attention weights."""
    if attention_mask is not None:
        raise ValueError("context parallelism computes the causal mask itself; it takes no attention_mask")
    for unsupported in ("sliding_window", "s_aux", "softcap"):
        if kwargs.get(unsupported) is not None:
            raise ValueError(f"ring attention is full causal attention; this model's {unsupported!r} is not "
                             f"supported under context parallelism")
    if module not in _HF_GROUPS:
        raise ValueError(f"{type(module).__name__} is not in the blocks apply_context_parallel was given")
    out = ring_attention(query, key, value, _HF_GROUPS[module], scale=scaling, dropout_p=dropout)
    return out.transpose(1, 2).contiguous(), None


def _apply_hf(model: nn.Module, description: ModelDescription, group) -> None:
    from transformers import AttentionInterface

    dropout = getattr(model.config, "attention_dropout", 0.0) or 0.0
    if dropout:
        raise ValueError(f"context parallelism needs model.dropout 0 (attention_dropout {dropout}): ring attention "
                         f"does not drop attention weights")
    for block in description.blocks(model):
        for module in block.modules():  # the attention module is the one transformers hands the function
            _HF_GROUPS[module] = group
    AttentionInterface.register(HF_ATTENTION, _hf_ring_attention)
    # a name without a registered mask function: transformers builds no mask (the ring masks causally itself)
    cast(Any, model).set_attn_implementation(HF_ATTENTION)

    def global_position_ids(module: nn.Module, args, kwargs):
        if kwargs.get("labels") is not None:
            raise ValueError("context parallelism needs train.loss 'cross_entropy' with targets shifted before "
                             "sharding: a model's own loss shifts labels within one rank's shard")
        mask = kwargs.get("attention_mask")
        if mask is not None:
            if not bool(mask.all()):
                raise ValueError("context parallelism does not support padding (an attention_mask with zeros)")
            kwargs["attention_mask"] = None
        if kwargs.get("position_ids") is None:  # given ones are taken as global already
            tokens = args[0] if args else kwargs.get("input_ids")
            tokens = kwargs.get("inputs_embeds") if tokens is None else tokens
            positions = _local_to_global(tokens.shape[1], group, tokens.device)
            kwargs["position_ids"] = positions.unsqueeze(0).expand(tokens.shape[0], -1)
        return args, kwargs

    model.register_forward_pre_hook(global_position_ids, with_kwargs=True)
