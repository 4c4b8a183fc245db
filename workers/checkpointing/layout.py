"""Where checkpoints live in a job's storage, and which of them are complete.

  checkpoints/step-00000050/   one DCP checkpoint: `.metadata` (written last, by rank 0) and the
                               shard files it names (`__<rank>_<n>.distcp`, one set per rank)
  model.safetensors, hf/       the exported model (export.py)

On a shared disk `.metadata` alone meant complete. On an object store a shard can go missing after
the metadata was written (a node's upload lost, an object deleted), so a checkpoint is complete
only when `.metadata` reads and every file its storage_data names is there, at least as long as
the bytes it points into. An incomplete one is never "latest": the previous complete one is.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from workers.checkpointing.metadata_reader import read_metadata
from workers.storage import Storage

ROOT = "checkpoints"
STEP_DIR = re.compile(r"^step-(\d{8})$")
EXPORT_NAME = "model.safetensors"
HF_DIR = "hf"
METADATA = ".metadata"

JobStorage = Storage | str | os.PathLike
OnIncomplete = Callable[[int, list[str]], None]  # (step, files missing)


def checkpoint_root(job: JobStorage) -> Storage:
    return Storage.of(job) / ROOT


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def checkpoint_steps(job: JobStorage) -> list[int]:
    """Steps of every checkpoint directory, complete or not, oldest first."""
    return sorted(int(m.group(1)) for name in checkpoint_root(job).list() if (m := STEP_DIR.match(name)))


def missing_files(checkpoint: Storage) -> list[str] | None:
    """What a checkpoint lacks: None without `.metadata` (a save that never finished), [] when complete,
    else the shard files its metadata names that are absent or shorter than the bytes named in them."""
    try:
        raw = checkpoint.read_bytes(METADATA)
    except FileNotFoundError:
        return None
    try:
        metadata = read_metadata(raw)  # torch-free: the supervisor reads it
        needed: dict[str, int] = {}
        for info in (metadata.storage_data or {}).values():
            needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    except Exception as exc:  # a truncated or foreign file: not a checkpoint to resume from
        return [f"{METADATA} (unreadable: {type(exc).__name__})"]
    held = checkpoint.sizes()
    return sorted(name for name, end in needed.items() if held.get(name, -1) < end)


def complete_checkpoints(job: JobStorage) -> list[tuple[int, Storage]]:
    """(step, checkpoint) of every complete checkpoint, oldest first."""
    root = checkpoint_root(job)
    return [(s, root / step_name(s)) for s in checkpoint_steps(job) if missing_files(root / step_name(s)) == []]


def latest_checkpoint(job: JobStorage, on_incomplete: OnIncomplete | None = None) -> tuple[int, Storage] | None:
    """The newest complete checkpoint; newer ones that lack files are reported to `on_incomplete`."""
    root = checkpoint_root(job)
    for step in reversed(checkpoint_steps(job)):
        missing = missing_files(root / step_name(step))
        if missing == []:
            return step, root / step_name(step)
        if missing and on_incomplete is not None:
            on_incomplete(step, missing)
    return None


def prune(job: JobStorage, keep: int) -> None:
    """Keep the newest `keep` complete checkpoints; remove every checkpoint older than those (an
    incomplete one too). Newer directories (a save in flight) are left alone."""
    done = complete_checkpoints(job)
    if len(done) <= keep:
        return
    oldest_kept = done[-keep][0]
    root = checkpoint_root(job)
    for step in checkpoint_steps(job):
        if step < oldest_kept:
            root.remove(step_name(step))
