"""Checkpoints with torch.distributed.checkpoint (DCP) and the exported model, on the job's storage
(a local directory or an object store): layout and completeness (layout.py), saving (saver.py,
writer.py, retry.py), loading (loading.py), export (export.py).
Its names load on first use (workers/lazy.py): the supervisor reads the layout without torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from workers.lazy import lazy_names

if TYPE_CHECKING:
    from workers.checkpointing.export import export_hf, export_model, full_model_state, state_sha256
    from workers.checkpointing.layout import (
        EXPORT_NAME,
        HF_DIR,
        STEP_DIR,
        checkpoint_root,
        complete_checkpoints,
        latest_checkpoint,
        missing_files,
        prune,
        step_name,
    )
    from workers.checkpointing.loading import CheckpointUnreadable, load_checkpoint, load_state, load_weights
    from workers.checkpointing.retry import RetryPolicy, StoreUnavailable
    from workers.checkpointing.saver import OPTIM_OPTIONS, Checkpointer

# Each name in three places (the typed imports, __all__ for linters, this table): tests/workers/test_lazy_packages.py
_HOME = {
    **dict.fromkeys(("export_hf", "export_model", "full_model_state", "state_sha256"), "export"),
    **dict.fromkeys(("EXPORT_NAME", "HF_DIR", "STEP_DIR", "checkpoint_root", "complete_checkpoints",
                     "latest_checkpoint", "missing_files", "prune", "step_name"), "layout"),
    **dict.fromkeys(("CheckpointUnreadable", "load_checkpoint", "load_state", "load_weights"), "loading"),
    **dict.fromkeys(("RetryPolicy", "StoreUnavailable"), "retry"),
    **dict.fromkeys(("OPTIM_OPTIONS", "Checkpointer"), "saver"),
}
__all__ = ["EXPORT_NAME", "HF_DIR", "OPTIM_OPTIONS", "STEP_DIR", "CheckpointUnreadable", "Checkpointer",
           "RetryPolicy", "StoreUnavailable", "checkpoint_root", "complete_checkpoints", "export_hf",
           "export_model", "full_model_state", "latest_checkpoint", "load_checkpoint", "load_state",
           "load_weights", "missing_files", "prune", "state_sha256", "step_name"]
__getattr__ = lazy_names(__name__, _HOME)
