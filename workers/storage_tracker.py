"""The high-water mark of bytes held by tensor storages during a region, on any device without an allocator
that counts (CPU): a TorchDispatchMode sees every storage an op creates, a weak reference sees it freed.

Counted: storages live when the region starts that the caller registers (parameters, gradients, optimiser
state) and every storage an op inside the region allocates (activations, gradients, optimiser state created
by the first update, communication buffers, temporaries). Not counted: other storages that existed before
the region (the dataset a batch is sliced from, a cached buffer), even when an op views or writes them,
unless they are resized.

Each storage is counted once under a category, fixed when it is first seen and moved when the caller says
what it became (`classify`, e.g. from a post-accumulate-grad hook); the breakdown at the peak is the
categories' live bytes at that moment. A storage resized outside the dispatcher (FSDP2 frees and
re-allocates its unsharded parameters with `UntypedStorage.resize_`) is followed by wrapping that method
while tracking, as torch.distributed._tools.mem_tracker does. A buffer that outlives steps and that only its
owner can reach (DDP's gradient buckets) is named by its owner (`note_lasting`): counted from then on,
and from the start of every later region tracked for the same owner while it lives; without it, every
step after the one that allocated it would leave it out.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

PARAMS, GRADS, OPTIMIZER, ACTIVATIONS = "params", "grads", "optimizer", "activations"
CATEGORIES = (PARAMS, GRADS, OPTIMIZER, ACTIVATIONS)


@dataclass(frozen=True)
class MemoryPeak:
    """The peak of one step: total bytes, what the categories held at that moment, and each category's
    own high-water mark (activations peak in the forward, the total often in the update)."""

    peak_bytes: int
    breakdown: dict[str, int]
    category_peaks: dict[str, int]


def storage_of(t: torch.Tensor) -> torch.UntypedStorage | None:
    """A tensor's storage (a DTensor's local shard's); None for a wrapper without real storage."""
    t = getattr(t, "_local_tensor", t)
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None


def _is_input(storage: torch.UntypedStorage, args: tuple, kwargs: dict | None) -> bool:
    """Whether an op's output storage is one of its inputs' (a view, an in-place or `out=` op): not an
    allocation. Checked only for storages not yet held, so mostly for fresh ones."""
    for a in (*args, *(kwargs or {}).values()):
        for t in a if isinstance(a, (tuple, list)) else (a,):
            if isinstance(t, torch.Tensor) and storage_of(t) is storage:
                return True
    return False


_ACTIVE: list["StorageTracker"] = []  # the trackers whose region is running (innermost last)
# id(storage) -> (storage, category, id(owner)): buffers kept across steps, by the module that keeps them
_LASTING: dict[int, tuple[weakref.ref, str, int]] = {}


def note_held(tensors: Iterable[torch.Tensor], category: str) -> None:
    """`tensors`' storages are of `category` now (in the running region, if any): a strategy's own
    gradient buffers, say, which no `.grad` hook sees."""
    if _ACTIVE:
        for t in tensors:
            _ACTIVE[-1].classify(t, category)


def _forget(key: int) -> Callable[[weakref.ref], None]:
    return lambda _: _LASTING.pop(key, None) and None


def note_lasting(tensors: Iterable[torch.Tensor], category: str, owner: object) -> None:
    """`tensors`' storages outlive the step: count them now (in a region tracked for `owner`) and in every
    later region tracked for `owner`."""
    for t in tensors:
        storage = storage_of(t)
        if storage is None:
            continue
        if id(storage) not in _LASTING:
            _LASTING[id(storage)] = (weakref.ref(storage, _forget(id(storage))), category, id(owner))
        if _ACTIVE and _ACTIVE[-1].owner is owner:
            _ACTIVE[-1].classify(t, category)


class StorageTracker(TorchDispatchMode):
    """Use as a context manager around the region; `peak()` afterwards."""

    def __init__(self, owner: object = None) -> None:
        super().__init__()
        self.owner = owner  # the module whose lasting buffers (note_lasting) this region counts
        self.category = ACTIVATIONS  # of storages allocated now (the caller sets OPTIMIZER around the update)
        self._live = dict.fromkeys(CATEGORIES, 0)
        self._total = 0
        self._peak = 0
        self._at_peak = dict(self._live)
        self._category_peaks = dict(self._live)
        self._held: dict[int, tuple[weakref.ref, str, int]] = {}  # id(storage) -> (ref, category, bytes)
        self._active = True
        self._resize: Any = None

    # --- what exists before the region -------------------------------------------------------------

    def register(self, tensors: Iterable[torch.Tensor], category: str) -> None:
        for t in tensors:
            storage = storage_of(t)
            if storage is not None:
                self._add(storage, category)

    def classify(self, t: torch.Tensor, category: str) -> None:
        """`t`'s storage is (now) of `category`: a gradient once accumulated, say."""
        storage = storage_of(t)
        if storage is None:
            return
        entry = self._held.get(id(storage))
        if entry is None:
            self._add(storage, category)
        elif entry[1] != category:
            ref, old, nbytes = entry
            self._held[id(storage)] = (ref, category, nbytes)
            self._shift(old, -nbytes)
            self._shift(category, nbytes)

    # --- bookkeeping ---------------------------------------------------------------------------------

    def _add(self, storage: torch.UntypedStorage, category: str) -> None:
        key = id(storage)
        if key in self._held:
            return
        nbytes = storage.nbytes()
        self._held[key] = (weakref.ref(storage, self._on_free(key)), category, nbytes)
        self._shift(category, nbytes)

    def _shift(self, category: str, nbytes: int) -> None:
        """`nbytes` more (or, negative, fewer) live in `category`."""
        live = self._live[category] = self._live[category] + nbytes
        if live > self._category_peaks[category]:
            self._category_peaks[category] = live
        self._total += nbytes
        if self._total > self._peak:
            self._peak = self._total
            self._at_peak = dict(self._live)

    def _on_free(self, key: int) -> Callable[[weakref.ref], None]:
        return lambda _: self._freed(key)

    def _freed(self, key: int) -> None:
        entry = self._held.pop(key, None)
        if entry is not None and self._active:
            self._shift(entry[1], -entry[2])

    def _resized(self, storage: torch.UntypedStorage) -> None:
        entry = self._held.get(id(storage))
        if entry is None:
            self._add(storage, self.category)
            return
        ref, category, old = entry
        new = storage.nbytes()
        self._held[id(storage)] = (ref, category, new)
        self._shift(category, new - old)

    # --- the mode ------------------------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                storage = storage_of(t)
                if storage is not None and id(storage) not in self._held and not _is_input(storage, args, kwargs):
                    self._add(storage, self.category)
        return out

    def __enter__(self):
        tracker, original = self, torch.UntypedStorage.resize_
        self._resize = original

        def resize_(storage: torch.UntypedStorage, size: int):
            result = original(storage, size)
            tracker._resized(storage)
            return result

        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign, assignment]
        _ACTIVE.append(self)
        for ref, category, owner in list(_LASTING.values()):
            storage = ref()
            if storage is not None and self.owner is not None and owner == id(self.owner):
                self._add(storage, category)
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            _ACTIVE.remove(self)
            torch.UntypedStorage.resize_ = self._resize  # type: ignore[method-assign]
            self._active = False  # storages freed later no longer matter
            self._held.clear()

    @property
    def live_bytes(self) -> int:
        return self._total

    def peak(self) -> MemoryPeak:
        return MemoryPeak(self._peak, dict(self._at_peak), dict(self._category_peaks))
