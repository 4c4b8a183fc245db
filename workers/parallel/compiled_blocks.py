"""`train.compile`: regional compilation, as torchtitan does it. Each repeated block of the model's
description is compiled in place (`Module.compile()`), so the model keeps its eager class and
parameter names (checkpoints load across compiled and eager jobs) and every block reuses the first
block's compiled graph (same class, same shapes): one compile, not n_blocks. A step of `parallelize`,
after tp/cp/ep and activation checkpointing and before the data-parallel step, which then wraps
compiled blocks (DDP buckets and FSDP2 hooks stay outside the compiled regions).

The compile caches live where a restarted rank on the same node finds them (`compile_cache_dir`):
inductor's FX graph cache and AOT autograd cache, under a node-local temp dir keyed by the job."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from torch import nn

from workers.parallel.common import model_description

CACHE_ROOT = "trainyard/compile-cache"


def compile_cache_dir(job_uri: str) -> Path:
    """The node-local compile cache of the job whose files live at `job_uri`: its last path part (the job
    id) and a short hash of the whole URI, so two services' jobs of the same id never share one."""
    name = job_uri.rstrip("/").rsplit("/", 1)[-1] or "job"
    digest = hashlib.sha1(job_uri.encode()).hexdigest()[:10]
    return Path(tempfile.gettempdir()) / CACHE_ROOT / f"{name}-{digest}"


def use_compile_cache(job_uri: str) -> Path:
    """Point inductor's caches at the job's directory; called in the rank's process before anything
    compiles. Inductor reads TORCHINDUCTOR_CACHE_DIR whenever it looks a cache up (the FX graph cache
    and the AOT autograd cache live under it); the two switches are config read at import, set here too."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    path = compile_cache_dir(job_uri)
    path.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    os.environ["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "1"
    os.environ["TORCHINDUCTOR_AUTOGRAD_CACHE"] = "1"
    inductor_config.fx_graph_cache = True
    functorch_config.enable_autograd_cache = True
    return path


def compile_blocks(model: nn.Module, ctx) -> int:
    """Compile each repeated block in place when the spec asks (`train.compile`); how many were compiled."""
    if not ctx.spec.train.compile:
        return 0
    blocks = model_description(model, ctx).blocks(model)
    for block in blocks:
        block.compile()
    return len(blocks)
