"""Checkpoints with torch.distributed.checkpoint (DCP) and the exported model.

Layout under the job directory:
  checkpoints/step-00000050/   one DCP checkpoint; complete once `.metadata` exists
  model.safetensors            the consolidated final model, loadable with plain torch
A checkpoint holds model, optimiser and progress: the step, and what rollbacks
changed (data windows skipped, the learning-rate factor; see workers/training/recovery.py).
The data position and the learning rate are pure functions of those, and RNG is
reseeded from (seed, step, rank) every step, so that is all the progress there is.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

# Optimiser state keyed per parameter name, hyper-parameters included ("param_groups.<fqn>.lr"):
# a rank that holds other parameters after a resharding (pipeline stages moving, pp <-> dp)
# finds each parameter's state and group settings by its own name.
OPTIM_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)

STEP_DIR = re.compile(r"^step-(\d{8})$")
EXPORT_NAME = "model.safetensors"


def checkpoint_root(job_dir: Path) -> Path:
    return job_dir / "checkpoints"


def complete_checkpoints(job_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of every finished checkpoint, oldest first."""
    root = checkpoint_root(job_dir)
    found = []
    if root.is_dir():
        for child in root.iterdir():
            m = STEP_DIR.match(child.name)
            if m and (child / ".metadata").exists():
                found.append((int(m.group(1)), child))
    return sorted(found)


def latest_checkpoint(job_dir: Path) -> tuple[int, Path] | None:
    done = complete_checkpoints(job_dir)
    return done[-1] if done else None


class Checkpointer:
    """Saves asynchronously on a dedicated gloo group so training collectives never interleave."""

    def __init__(self, job_dir: Path, keep: int, rank: int):
        self.job_dir, self.keep, self.rank = job_dir, keep, rank
        self.group = dist.new_group(backend="gloo")
        self._pending: Future | None = None
        self._pending_step = 0
        self._started = 0.0
        self.last_duration_s: float | None = None  # save start to durable, of the last completed save
        self.progress: dict = {}  # recorded beside the step (the trainer's data skips and LR factor)

    def save(self, model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
        self.wait()  # at most one save in flight (callers that report durability wait first)
        self._started = time.monotonic()
        model_sd, optim_sd = get_state_dict(model, optimizer, options=OPTIM_OPTIONS)
        state = {"model": model_sd, "optim": optim_sd, "progress": {**self.progress, "step": step}}
        path = checkpoint_root(self.job_dir) / f"step-{step:08d}"
        pending = dcp.async_save(state, checkpoint_id=str(path), process_group=self.group)
        assert isinstance(pending, Future)  # an AsyncSaveResponse comes only with async staging (not asked for)
        self._pending = pending
        self._pending_step = step

    def completed(self) -> int | None:
        """The step of the in-flight save if it has just become durable (non-blocking)."""
        if self._pending is not None and self._pending.done():
            return self.wait()
        return None

    def wait(self) -> int | None:
        """Block until the in-flight save is durable; returns its step."""
        if self._pending is None:
            return None
        self._pending.result()
        self._pending = None
        self.last_duration_s = time.monotonic() - self._started
        if self.rank == 0:
            self._prune()
        return self._pending_step

    def _prune(self) -> None:
        for _, path in complete_checkpoints(self.job_dir)[: -self.keep]:
            shutil.rmtree(path, ignore_errors=True)


def load_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Load model and optimiser state (resharding as DCP allows); returns the step."""
    return int(load_state(path, model, optimizer)["step"])


def load_state(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Load model and optimiser state (resharding as DCP allows); returns the recorded progress."""
    model_sd, optim_sd = get_state_dict(model, optimizer, options=OPTIM_OPTIONS)
    # Progress holds the step and whatever else the checkpoint recorded (older ones: the step only).
    saved = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    progress = {k.split(".", 1)[1]: None for k in saved if k.startswith("progress.")} | {"step": 0}
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd, "progress": progress}  # loaded in place
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=OPTIM_OPTIONS)
    return dict(state["progress"])


def load_weights(source: Path, model: nn.Module) -> None:
    """Initialise weights from an exported .safetensors file, a checkpoint, a job directory, or a
    Hugging Face save_pretrained directory (a job's `hf/` export)."""
    if source.is_dir() and (source / "config.json").is_file():
        from transformers import (
            AutoModelForCausalLM,  # it restores weights that save_pretrained tied
        )

        model.load_state_dict(AutoModelForCausalLM.from_pretrained(str(source), local_files_only=True).state_dict())
        return
    if source.is_dir() and (source / EXPORT_NAME).exists():
        source = source / EXPORT_NAME
    elif source.is_dir() and not (source / ".metadata").exists():
        latest = latest_checkpoint(source)
        if latest is None:
            raise FileNotFoundError(f"train.init_from: no exported model or checkpoint under {source}")
        source = latest[1]
    if source.is_file():
        model.load_state_dict(load_file(str(source)))
        return
    state = {"model": get_model_state_dict(model)}
    dcp.load(state, checkpoint_id=str(source))
    set_model_state_dict(model, state["model"])


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


def export_model(job_dir: Path, state: dict[str, torch.Tensor], metadata: dict) -> Path:
    path = job_dir / EXPORT_NAME
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in state.items()}
    save_file(tensors, str(path), metadata={k: json.dumps(v) for k, v in metadata.items()})
    return path
