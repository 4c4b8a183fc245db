"""Hugging Face causal LMs: built from a config (random init from the seed already set) or a local
save_pretrained directory, and exported back as one."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from workers.spec.hf_config import hf_config


def build_hf_model(model_type: str | None, fields: dict | None, pretrained: str | None) -> nn.Module:
    from transformers import AutoModelForCausalLM

    config = hf_config(model_type, fields, pretrained)
    config.use_cache = False  # training: no key/value cache
    if pretrained is not None:
        model = AutoModelForCausalLM.from_pretrained(pretrained, config=config, local_files_only=True,
                                                     dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model


def save_pretrained(model_type: str | None, fields: dict | None, pretrained: str | None,
                    state: dict[str, torch.Tensor], out: Path) -> Path:
    """Write the full state as a save_pretrained directory (config.json + safetensors) that
    `AutoModelForCausalLM.from_pretrained(out)` loads."""
    from transformers import AutoModelForCausalLM

    config = hf_config(model_type, fields, pretrained)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(state, strict=True, assign=True)
    model.save_pretrained(str(out), safe_serialization=True)
    return out


def is_hf_directory(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()
