"""A rank that runs out of memory fails its job at once, saying so and with the figures.

A restart would run the same layout on the same machines and run out again, so the error carries its
own cause (`RestartCause.OUT_OF_MEMORY`, which the failure policy never restarts:
service/supervisor/policies/failure.py) and is not retryable; its message says how much the allocation
asked for, the peak the rank reached and the peak the planner predicted, where known.

Out of memory, as each allocator says it: torch.OutOfMemoryError (CUDA; also what newer CPU builds
raise), Python's MemoryError, and the CPU allocator's RuntimeError ("DefaultCPUAllocator: can't allocate
memory"), told by its text because that is the only thing that tells it apart.
"""

from __future__ import annotations

import re
import resource

import torch

from workers.events import RestartCause

_CPU_ALLOCATOR = ("DefaultCPUAllocator: can't allocate memory", "DefaultCPUAllocator: not enough memory")
_TRIED = re.compile(r"(?:tried|Tried) to allocate ([\d.]+) ?(bytes|[KMGTP]iB)?")
_UNITS = {None: 1, "bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "PiB": 2**50}


class OutOfMemory(RuntimeError):
    """A rank ran out of memory: fail the job, no restart."""

    restart_cause = RestartCause.OUT_OF_MEMORY
    retryable = False  # read by workers/runtime/group.py: no restart fixes it


def is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, OutOfMemory):
        return False  # already typed
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    return isinstance(exc, RuntimeError) and any(s in str(exc) for s in _CPU_ALLOCATOR)


def attempted_bytes(exc: BaseException) -> int | None:
    """What the failed allocation asked for, as its message says (None when it does not)."""
    found = _TRIED.search(str(exc))
    return int(float(found.group(1)) * _UNITS[found.group(2)]) if found else None


def peak_bytes(device: torch.device) -> tuple[int, str]:
    """The most this rank held: (bytes, what that figure is)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "allocated on its GPU"
    # Linux reports the high-water mark of the resident set in KiB.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "resident (its process's high-water mark)"


def out_of_memory(exc: BaseException, rank: int, where: str, device: torch.device,
                  predicted_bytes: int | None = None) -> OutOfMemory:
    """The typed error for `exc`, an allocator's out-of-memory error in `where` (e.g. "step 3")."""
    asked = attempted_bytes(exc)
    peak, of_what = peak_bytes(device)
    parts = [f"rank {rank} ran out of memory in {where}"]
    if asked is not None:
        parts.append(f"an allocation of {_gib(asked)} failed")
    parts.append(f"peak reached {_gib(peak)} {of_what}")
    if predicted_bytes is not None:
        parts.append(f"predicted peak per worker {_gib(predicted_bytes)}")
    detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
    return OutOfMemory("; ".join(parts) + f" ({type(exc).__name__}: {detail}); not restarted: it would run out "
                       "again (lower train.micro_batch_size, shard more with parallel.zero/tp/pp, or give "
                       "workers more memory)")


def _gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB ({n:,} bytes)"
