"""Reading checkpoints and weights back, straight from the job's storage (local disk or object store).

DCP reshards on load: each rank reads the parts of the saved tensors its current layout holds, so a
job resumed with another layout (dp 2 -> 1, zero 3 -> ddp) reads the same checkpoint. On an object
store a rank fetches only those parts (store_reader.py); `last_read` says how many bytes that was.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load as load_safetensors
from torch import nn
from torch.distributed.checkpoint import StorageReader
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from workers.checkpointing.layout import EXPORT_NAME, METADATA, latest_checkpoint
from workers.checkpointing.saver import OPTIM_OPTIONS
from workers.checkpointing.store_reader import StoreReader
from workers.checkpointing.writer import reader_for
from workers.storage import Storage

log = logging.getLogger("trainyard.checkpoint")


@dataclass
class ReadCount:
    """This process's last load from an object store: the bytes fetched (metadata included), of the
    checkpoint's shard files' total."""

    checkpoint: str = ""
    bytes_read: int = 0
    checkpoint_bytes: int = 0


last_read = ReadCount()  # for the resume log line, its test and bench/checkpoint_reads.py


class CheckpointUnreadable(RuntimeError):
    """A checkpoint that was complete when chosen lost a file before it was read (a node's loss, a
    deletion): recoverable, since the next attempt's scan skips it for the previous complete one."""


def load_checkpoint(checkpoint: Storage | str | os.PathLike, model: nn.Module,
                    optimizer: torch.optim.Optimizer) -> int:
    """Load model and optimiser state (resharding as DCP allows); returns the step."""
    return int(load_state(checkpoint, model, optimizer)["step"])


def load_state(checkpoint: Storage | str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Load model and optimiser state (resharding as DCP allows); returns the recorded progress."""
    where = Storage.of(checkpoint)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=OPTIM_OPTIONS)
    try:
        with _reader(where) as reader:
            # Progress holds the step and whatever else the checkpoint recorded (older ones: the step only).
            saved = reader.read_metadata().state_dict_metadata
            progress = {k.split(".", 1)[1]: None for k in saved if k.startswith("progress.")} | {"step": 0}
            state: dict[str, Any] = {"model": model_sd, "optim": optim_sd, "progress": progress}  # loaded in place
            dcp.load(state, storage_reader=reader)
    except (FileNotFoundError, dcp.api.CheckpointException) as exc:
        raise CheckpointUnreadable(f"checkpoint {where.uri} could not be read: {exc}") from exc
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=OPTIM_OPTIONS)
    return dict(state["progress"])


def load_weights(source: Storage | str | os.PathLike, model: nn.Module) -> None:
    """Initialise weights from an exported .safetensors file, a checkpoint, a job directory, or a
    Hugging Face save_pretrained directory (a job's `hf/` export), on a local disk or an object store."""
    where = Storage.of(source)
    if where.is_dir() and where.exists("config.json"):
        _load_hf(where, model)
        return
    if where.is_dir() and where.exists(EXPORT_NAME):
        where = where / EXPORT_NAME
    elif where.is_dir() and not where.exists(METADATA):
        latest = latest_checkpoint(where)
        if latest is None:
            raise FileNotFoundError(f"train.init_from: no exported model or checkpoint under {where.uri}")
        where = latest[1]
    if not where.is_dir():
        if not where.parent.exists(where.name):
            raise FileNotFoundError(f"train.init_from: {where.uri} does not exist")
        model.load_state_dict(load_safetensors(where.parent.read_bytes(where.name)))
        return
    state = {"model": get_model_state_dict(model)}
    with _reader(where) as reader:
        dcp.load(state, storage_reader=reader)
    set_model_state_dict(model, state["model"])


@contextmanager
def _reader(checkpoint: Storage) -> Iterator[StorageReader]:
    if checkpoint.is_local:
        yield reader_for(checkpoint)
        return
    reader = StoreReader(checkpoint)
    yield reader
    whole = reader.checkpoint_bytes()
    last_read.checkpoint, last_read.bytes_read, last_read.checkpoint_bytes = checkpoint.uri, reader.bytes_read, whole
    log.info("read %d of the %d bytes of checkpoint %s", reader.bytes_read, whole, checkpoint.uri)


def _load_hf(where: Storage, model: nn.Module) -> None:
    from transformers import AutoModelForCausalLM  # it restores weights that save_pretrained tied

    with tempfile.TemporaryDirectory(prefix="trainyard-hf-") as tmp:
        local = where.local_path if where.is_local else Path(tmp) / "hf"
        if not where.is_local:
            where.download("", local)
        model.load_state_dict(AutoModelForCausalLM.from_pretrained(str(local), local_files_only=True).state_dict())
