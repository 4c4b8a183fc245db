"""The exported model: `model.safetensors` (the consolidated final state, loadable with plain torch)
and, for an HF model, `hf/` (a save_pretrained directory), written to the job's storage."""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import cast

import torch
from safetensors.torch import save_file
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from workers.checkpointing.layout import EXPORT_NAME, HF_DIR, JobStorage
from workers.storage import Storage


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model state on CPU (collective: every rank must call it)."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    # a full state dict holds plain tensors (no sharded ones), which the return type of torch does not say
    return cast(dict[str, torch.Tensor], get_model_state_dict(model, options=options))


def state_sha256(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def export_model(job: JobStorage, state: dict[str, torch.Tensor], metadata: dict) -> str:
    """Write `model.safetensors`; its URI (a path on local storage)."""
    storage = Storage.of(job)
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in state.items()}
    meta = {k: json.dumps(v) for k, v in metadata.items()}
    return _through_local(storage, EXPORT_NAME, lambda path: save_file(tensors, str(path), metadata=meta))


def export_hf(job: JobStorage, write: Callable[[Path], object]) -> str:
    """Write the save_pretrained directory `hf/` with `write(local_dir)`; its URI."""
    return _through_local(Storage.of(job), HF_DIR, write)


def _through_local(storage: Storage, rel: str, write: Callable[[Path], object]) -> str:
    """Write in place on a local disk; on an object store, into a temporary directory uploaded after."""
    if storage.is_local:
        storage.local_path.mkdir(parents=True, exist_ok=True)
        write(storage.local_path / rel)
        return str(storage.local_path / rel)
    with tempfile.TemporaryDirectory(prefix="trainyard-export-") as tmp:
        write(Path(tmp) / rel)
        storage.upload(Path(tmp) / rel, rel)
    return storage.url(rel)
