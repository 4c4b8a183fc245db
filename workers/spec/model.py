"""The `model` section: the built-in gpt and mlp, a Hugging Face causal LM, any user nn.Module."""

from __future__ import annotations

import functools
import json
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, Discriminator, Field, Tag, model_validator

from workers.spec.base import EntrypointSpec, Strict, section_kind
from workers.spec.errors import FieldError
from workers.spec.hf_config import HFFacts, hf_config, hf_facts, readable_pretrained

TP_STYLES = ("colwise", "rowwise", "colwise_gather_output", "embedding_rowwise", "sequence_parallel")
FQN_PATTERN = r"^[A-Za-z_]\w*(\.\w+)*$"
TP_PLAN_KEY = r"^[\w*]+(\.[\w*]+)*$"


class _ModelStructure(Strict):
    """What the strategies need of any model (workers/models/description.py finds it when left out)."""
    blocks: str | None = Field(None, pattern=FQN_PATTERN, description="FQN of the repeated layers, e.g. "
                               "'model.layers'; default: the largest ModuleList of same-class children")
    tp_plan: dict[Annotated[str, Field(pattern=TP_PLAN_KEY)], Literal[TP_STYLES]] | None = Field(  # type: ignore[valid-type]
        None, description="tensor-parallel plan {module FQN glob: colwise | rowwise | colwise_gather_output | "
                          "embedding_rowwise | sequence_parallel}; default: the model's own "
                          "(transformers' base_model_tp_plan, the built-in gpt's)")


class GPTMoESpec(Strict):
    """Mixture-of-Experts in place of each block's MLP (workers/models/moe.py)."""
    experts: int = Field(ge=2, le=4096, description="expert MLPs per block")
    top_k: int = Field(ge=1, description="experts each token is routed to (gates: softmax, top-k, renormalised); "
                                         "at most experts")
    capacity_factor: float | None = Field(None, gt=0.0, description="each expert takes at most "
                                          "ceil(capacity_factor * tokens * top_k / experts) tokens per forward, the "
                                          "rest pass through the residual only; null: no token is dropped")
    aux_loss_weight: float = Field(0.01, ge=0.0, description="weight of the load-balancing loss "
                                   "(experts * sum f_e * P_e per block) added to the training loss")

    @model_validator(mode="after")
    def _top_k_within_experts(self) -> "GPTMoESpec":
        if self.top_k > self.experts:
            raise FieldError("model.moe.top_k", f"must be at most model.moe.experts "
                                                f"(top_k={self.top_k}, experts={self.experts})")
        return self


class GPTModelSpec(_ModelStructure):
    """The built-in byte-level GPT, a small decoder-only transformer."""
    name: Literal["gpt"] = Field("gpt", description="the built-in GPT")
    n_layers: int = Field(2, ge=1, le=256, description="transformer blocks")
    d_model: int = Field(64, ge=8, le=16384, description="embedding width")
    n_heads: int = Field(4, ge=1, le=256, description="attention heads; must divide d_model")
    seq_len: int = Field(64, ge=2, le=65536, description="context length in tokens")
    vocab_size: int = Field(256, ge=2, description="byte-level vocabulary by default")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout probability in training on the embeddings, the "
                                                "attention weights and each block's MLP output; 0 disables")
    moe: GPTMoESpec | None = Field(None, description="Mixture-of-Experts MLPs {experts, top_k, capacity_factor, "
                                                     "aux_loss_weight}; null: the dense MLP")

    @model_validator(mode="after")
    def _heads_divide_width(self) -> "GPTModelSpec":
        if self.d_model % self.n_heads:
            raise FieldError("model.d_model", f"must be divisible by model.n_heads "
                                              f"(d_model={self.d_model}, n_heads={self.n_heads})")
        return self


class MLPModelSpec(_ModelStructure):
    """The built-in multi-layer perceptron for vector regression (data.name 'synthetic' or an entrypoint)."""
    name: Literal["mlp"] = Field(description="the built-in MLP")
    in_features: int = Field(16, ge=1, description="input width; with data 'synthetic' it must equal "
                                                   "data.in_features")
    hidden: int = Field(64, ge=1, description="width of every hidden layer (each a Linear and a GELU)")
    out_features: int = Field(1, ge=1, description="output width; with data 'synthetic' it must equal "
                                                   "data.out_features")
    n_layers: int = Field(2, ge=1, le=64, description="hidden layers")


DEFAULT_TABLE_SIZES = (1000, 1000, 500, 100)  # rows per embedding table: small, so a CPU test trains in seconds
TableSize = Annotated[int, Field(ge=2, le=100_000_000)]


class DLRMModelSpec(Strict):
    """The built-in DLRM (workers/models/dlrm.py): an embedding table per categorical feature, a bottom MLP over
    the dense features, pairwise dot products of all of them, a top MLP to one click logit (train.loss 'bce')."""
    name: Literal["dlrm"] = Field(description="the built-in recommendation model")
    dense_features: int = Field(8, ge=1, le=4096, description="width of the dense (continuous) input")
    table_sizes: list[TableSize] = Field(list(DEFAULT_TABLE_SIZES), min_length=1, max_length=64,
                                         description="rows of each embedding table, one per categorical feature")
    embedding_dim: int = Field(16, ge=1, le=4096, description="width of every embedding row; the bottom MLP "
                                                              "ends at this width too")
    bottom_hidden: int = Field(32, ge=1, le=65536, description="hidden width of the bottom (dense) MLP")
    top_hidden: int = Field(32, ge=1, le=65536, description="hidden width of the top MLP")

    # What every model section answers for the strategies (not keys: the dlrm has no repeated blocks and no
    # tensor-parallel plan, and the spec rules refuse the layouts that would need them).
    @property
    def blocks(self) -> None:
        return None

    @property
    def tp_plan(self) -> None:
        return None


class ModelEntrypointSpec(EntrypointSpec, _ModelStructure):
    """Any nn.Module a user factory returns: `entrypoint` names the factory, `args` its keyword arguments."""


class HFConfigSource(Strict):
    """A model built from a config alone, with freshly initialised weights."""
    model_type: str = Field(min_length=1, description="a transformers model type, e.g. 'llama', 'gpt2'")
    config: dict[str, Any] = Field(default_factory=dict, description="fields of that model type's config")


class HFPretrainedSource(Strict):
    """A model loaded from a saved directory, its weights included."""
    pretrained: str = Field(min_length=1, description="a local save_pretrained directory under the storage root "
                                                      "(never a hub download)")


def _hf_source(value: Any) -> str | None:
    if isinstance(value, BaseModel):
        return "pretrained" if isinstance(value, HFPretrainedSource) else "config"
    return ("pretrained" if "pretrained" in value else "config") if isinstance(value, dict) else None


class HFModelSpec(_ModelStructure):
    """A Hugging Face transformers causal LM (the optional extra `trainyard[hf]`)."""
    hf: Annotated[Union[Annotated[HFConfigSource, Tag("config")], Annotated[HFPretrainedSource, Tag("pretrained")]],
                  Discriminator(_hf_source, custom_error_type="model.hf",
                                custom_error_message="model.hf must give model_type (and config) or pretrained"),
                  Field(description="where the model comes from: a model_type and its config (new weights), or a "
                                    "pretrained directory")]

    @model_validator(mode="after")
    def _config_builds(self) -> "HFModelSpec":
        hf_facts_of(self)  # an unknown model type or config field is refused here, by name
        return self


def _model_kind(value: Any) -> str | None:
    return section_kind(value, ("entrypoint", "hf"))


ModelSpec = Annotated[
    Union[
        Annotated[GPTModelSpec, Tag("gpt")],
        Annotated[MLPModelSpec, Tag("mlp")],
        Annotated[DLRMModelSpec, Tag("dlrm")],
        Annotated[ModelEntrypointSpec, Tag("entrypoint")],
        Annotated[HFModelSpec, Tag("hf")],
    ],
    Discriminator(_model_kind, custom_error_type="model.name",
                  custom_error_message="model.name must be 'gpt', 'mlp' or 'dlrm', or give model.hf or "
                                       "model.entrypoint"),
]
USER_MODELS = (ModelEntrypointSpec, HFModelSpec)  # models the strategies only know through their description


def hf_facts_of(m: HFModelSpec) -> HFFacts | None:
    """The config facts the rules need; None for a pretrained directory the service cannot read yet."""
    src = m.hf
    if isinstance(src, HFPretrainedSource):
        return _cached_hf_facts(None, "{}", src.pretrained)
    return _cached_hf_facts(src.model_type, json.dumps(src.config, sort_keys=True, default=str), None)


@functools.lru_cache(maxsize=64)
def _cached_hf_facts(model_type: str | None, config: str, pretrained: str | None) -> HFFacts | None:
    if pretrained is not None and not readable_pretrained(pretrained):
        return None
    return hf_facts(hf_config(model_type, json.loads(config), pretrained))
