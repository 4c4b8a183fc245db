"""Hugging Face configs: build one from a spec's `model.hf` and read the facts the spec rules need.

Kept apart from the model builder so that validating a spec needs
only `transformers`' config classes, never weights. `transformers` is the optional extra
`trainyard[hf]`; without it an `hf` model is refused by name.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workers.spec.errors import FieldError
from workers.spec.suggest import did_you_mean


class HFConfigError(FieldError):
    """A `model.hf` that cannot become a config."""


@dataclass(frozen=True)
class HFFacts:
    model_type: str
    n_layers: int
    n_heads: int | None
    n_kv_heads: int | None
    vocab_size: int
    has_tp_plan: bool  # transformers ships a base_model_tp_plan for this model type
    tied_embeddings: bool
    experts: int | None = None  # MoE models (Mixtral, Qwen3-MoE): experts per layer
    experts_field: str = "num_local_experts"  # the config field a user sets for them
    tp_plan_shards_mlp: bool = False  # its tp plan names the MLP (Qwen3-MoE's dense layers), not only attention


def _transformers():
    try:
        import transformers
    except ImportError as exc:  # the optional extra is missing
        raise HFConfigError("model.hf", "needs the transformers package on the service and the workers "
                                        "(pip install 'trainyard[hf]')") from exc
    return transformers


def _config_from_type(model_type: str, fields: dict[str, Any]):
    transformers = _transformers()
    try:
        cls = transformers.AutoConfig.for_model(model_type).__class__
    except ValueError:
        hint = did_you_mean(model_type, transformers.CONFIG_MAPPING.keys())
        raise HFConfigError("model.hf.model_type", f"{model_type!r} is not a transformers model type{hint}") from None
    allowed = set(cls().to_dict()) | set(getattr(cls, "attribute_map", {}))
    for key in fields:
        if key not in allowed:
            hint = did_you_mean(key, allowed)
            raise HFConfigError(f"model.hf.config.{key}", f"is not a field of {cls.__name__}{hint}")
    try:
        return cls(**fields)
    except (TypeError, ValueError) as exc:
        raise HFConfigError("model.hf.config", f"{cls.__name__} refused it: {exc}") from None


def _config_from_dir(directory: str):
    path = Path(directory)
    if not (path / "config.json").is_file():
        raise HFConfigError("model.hf.pretrained", f"{directory} is not a save_pretrained directory "
                                                   "(no config.json in it)")
    return _transformers().AutoConfig.from_pretrained(str(path), local_files_only=True)


def hf_config(model_type: str | None, fields: dict[str, Any] | None, pretrained: str | None):
    """The PretrainedConfig of a `model.hf` (from its type and fields, or a local directory)."""
    if pretrained is not None:
        return _config_from_dir(pretrained)
    return _config_from_type(model_type or "", fields or {})


def readable_pretrained(directory: str) -> bool:
    """Whether a `pretrained` path can be checked here (the service may not see a relative one yet)."""
    return Path(directory).is_absolute() and Path(directory, "config.json").is_file()


def hf_facts(config) -> HFFacts:
    def get(name: str) -> Any:
        return getattr(config, name, None)

    return HFFacts(
        model_type=config.model_type,
        n_layers=int(get("num_hidden_layers") or 0),
        n_heads=get("num_attention_heads"),
        n_kv_heads=get("num_key_value_heads") or get("num_attention_heads"),
        vocab_size=int(get("vocab_size") or 0),
        has_tp_plan=bool(get("base_model_tp_plan")),
        tied_embeddings=bool(get("tie_word_embeddings")),
        experts=get("num_local_experts") or get("num_experts") if get("base_model_ep_plan") else None,
        # Qwen3-MoE names it num_experts, Mixtral num_local_experts; transformers aliases one to the other
        tp_plan_shards_mlp=any(".mlp." in key for key in get("base_model_tp_plan") or {}),
        experts_field="num_experts" if "num_experts" in inspect.signature(type(config).__init__).parameters
        else "num_local_experts",
    )


def config_json(config) -> str:
    return json.dumps(config.to_dict(), sort_keys=True, default=str)
