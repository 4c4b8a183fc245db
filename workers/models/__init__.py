"""Model registry: built-in models by name, user models by entrypoint."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from workers.entrypoints import EntrypointError, resolve_entrypoint
from workers.models.dlrm import DLRM
from workers.models.gpt import GPT
from workers.models.mlp import MLPRegressor
from workers.models.moe import MoEConfig
from workers.spec import (
    DLRMModelSpec,
    GPTModelSpec,
    HFModelSpec,
    HFPretrainedSource,
    JobSpec,
    MLPModelSpec,
    ModelEntrypointSpec,
)


def _gpt(m: GPTModelSpec) -> nn.Module:
    moe = None if m.moe is None else MoEConfig(**m.moe.model_dump())
    return GPT(m.vocab_size, m.seq_len, m.n_layers, m.d_model, m.n_heads, m.dropout, moe)


def _mlp(m: MLPModelSpec) -> nn.Module:
    return MLPRegressor(m.in_features, m.hidden, m.out_features, m.n_layers)


def _dlrm(m: DLRMModelSpec) -> nn.Module:
    return DLRM(m.dense_features, list(m.table_sizes), m.embedding_dim, m.bottom_hidden, m.top_hidden)


def _entrypoint(m: ModelEntrypointSpec) -> nn.Module:
    model = resolve_entrypoint(m.entrypoint, "model.entrypoint")(**m.args)
    if not isinstance(model, nn.Module):
        raise EntrypointError(f"model.entrypoint: {m.entrypoint} returned {type(model).__name__}, not an nn.Module")
    return model


def hf_source(m: HFModelSpec) -> tuple[str | None, dict | None, str | None]:
    """(model_type, config fields, pretrained directory) of a `model.hf`."""
    src = m.hf
    if isinstance(src, HFPretrainedSource):
        return None, None, src.pretrained
    return src.model_type, dict(src.config), None


def _hf(m: HFModelSpec) -> nn.Module:
    from workers.models.hf import build_hf_model

    return build_hf_model(*hf_source(m))


MODEL_BUILDERS: dict[type, Callable] = {
    GPTModelSpec: _gpt,
    MLPModelSpec: _mlp,
    DLRMModelSpec: _dlrm,
    ModelEntrypointSpec: _entrypoint,
    HFModelSpec: _hf,
}


def build_model(spec: JobSpec) -> nn.Module:
    """Build the model with weights that depend only on train.seed."""
    torch.manual_seed(spec.train.seed)
    return MODEL_BUILDERS[type(spec.model)](spec.model)
