"""Integrity where no replica exists: each rank checksums the state it holds when the optimizer has
written it, and verifies the checksums before that state is next read.

Comparing replicas (workers/training/integrity.py) cannot see a bit flipped in state that one rank
holds alone (a ZeRO owner's optimizer shard, an FSDP shard, any rank's AdamW moments), nor one flipped
in a shard that its owner then all-gathers to every replica (they all agree on the wrong value). So
each rank also checks its own state over time:

  seal    right after `optimizer.step()` (ZeRO-1/2: after its all-gather), and the first time the
          check runs (after a checkpoint is loaded): one checksum per tensor the rank holds at rest:
          its parameters (the local shard of a DTensor: FSDP, HSDP, TP; the whole tensor otherwise),
          its buffers, its optimizer state (local shards: ZeRO, FSDP) and step counters.
  verify  before the next step's forward, so before FSDP's all-gather spreads a shard and before ZeRO's
          owner updates its rows from it, and before every checkpoint is saved: the same checksums
          again. Any difference is a change at rest: nothing should write there between the two.

The verdict is a collective over the job's CPU group (one all-reduce of a flag per rank per check),
so every rank raises `SilentDataCorruption` at the same step, naming the ranks and the tensors that
changed; the supervisor restores the last checkpoint, which was verified when it was saved.

The checksum of a tensor is the sum of its bytes read as 64-bit words (32-, 16- or 8-bit where the
storage is not aligned), wrapping: one vectorised reduction per tensor with torch ops, on whichever
device holds it, and one small vector of sums per device, compared where it lies (one device-to-host
sync per check). It catches any single flipped bit (the word changes by +-2^k, never 0 modulo 2^64)
and almost any multi-bit corruption. It cannot catch changes that cancel in the sum (two words
moved by opposite amounts, such as two equal-sized words swapped), a fault inside the arithmetic
itself (the optimizer or a gather computing a wrong value: sealed as if right), a flip between the
write and the seal (inside `optimizer.step()`), or state outside the model and optimizer (a
communication hook's error feedback, the data loader).
"""

from __future__ import annotations

import torch
from torch import nn

from workers.parallel.control_group import ControlGroups
from workers.parallel.replicas import local
from workers.training.integrity import SilentDataCorruption

# (word size in bytes, the integer dtype read), widest first: a sum of fewer, wider words is faster.
_WORDS = ((8, torch.int64), (4, torch.int32), (2, torch.int16), (1, torch.uint8))


def words(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as integer words, the widest that fit its size and alignment: a 1-D view
    (of a copy when the tensor is strided, which no held tensor is)."""
    raw = t.detach().reshape(-1).view(torch.uint8)
    for size, dtype in _WORDS:
        if raw.numel() % size == 0 and raw.storage_offset() % size == 0:
            return raw.view(dtype)
    raise AssertionError("unreachable: one-byte words always fit")


def sum_of(w: torch.Tensor) -> torch.Tensor:
    """The words' wrapping sum as a 0-dim int64 on their device (summed in their own width: vectorised)."""
    total = w.sum(dtype=w.dtype)
    return total if w.dtype == torch.int64 else total.to(torch.int64)


def word_sum(t: torch.Tensor) -> torch.Tensor:
    """The tensor's checksum: a 0-dim int64 on its device (the sum of its bytes as words, wrapping)."""
    return sum_of(words(t))


def held_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[tuple[str, torch.Tensor]]:
    """What this rank holds at rest between steps, by name: its parameters and buffers (local shards)
    and its optimizer's state tensors (local shards), each the tensor itself, never a copy."""
    names = {id(p): n for n, p in model.named_parameters()}
    held = [(f"parameter {n}", local(p.detach())) for n, p in model.named_parameters()]
    held += [(f"buffer {n}", local(b)) for n, b in model.named_buffers()]
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in optimizer.state.get(p, {}).items():
                if isinstance(value, torch.Tensor):
                    held.append((f"optimizer {names.get(id(p), '?')}.{key}", local(value)))
    return held


class HeldStateSeal:
    """Checksums of one rank's held state: `seal()` after the optimizer writes it, `changed()` before
    it is read again."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        self.model, self.optimizer = model, optimizer
        self.names: list[str] = []
        self.tensors: list[torch.Tensor] = []
        self.sealed: dict[torch.device, torch.Tensor] | None = None
        # The tensors' word views and their indices per device, kept while the held storage stays the same
        # (from the second step on: AdamW updates in place), so that a check costs one sum per tensor.
        self._key: list[tuple] = []
        self._words: list[torch.Tensor | None] = []
        self._devices: dict[torch.device, list[int]] = {}

    @torch.no_grad()
    def seal(self) -> None:
        held = held_state(self.model, self.optimizer)  # again each time: AdamW creates its state lazily
        self.names, self.tensors = [n for n, _ in held], [t for _, t in held]
        key = [(t.data_ptr(), t.numel(), t.dtype, t.device) for t in self.tensors]
        if key != self._key:
            self._key = key
            self._words = [words(t) if t.is_contiguous() else None for t in self.tensors]  # None: copied each time
            self._devices = {}
            for i, t in enumerate(self.tensors):
                self._devices.setdefault(t.device, []).append(i)
        self.sealed = self._checksums()

    def _checksums(self) -> dict[torch.device, torch.Tensor]:
        """Per device, one vector: the checksums of its tensors, in `self._devices`' order."""
        return {device: torch.stack([sum_of(w if (w := self._words[i]) is not None else words(self.tensors[i]))
                                     for i in indices])
                for device, indices in self._devices.items()}

    @property
    def bytes(self) -> int:
        """Bytes one seal or one verification reads."""
        return sum(t.numel() * t.element_size() for t in self.tensors)

    @torch.no_grad()
    def changed(self) -> list[str]:
        """The names of the sealed tensors whose checksum differs now ([] before the first seal)."""
        if self.sealed is None:
            return []
        now = self._checksums()
        changed: list[int] = []
        for device, before in self.sealed.items():
            after, indices = now[device], self._devices[device]
            if not torch.equal(before, after):  # one sync per device
                changed += [indices[int(j)] for j in torch.nonzero(before != after).flatten().tolist()]
        return [self.names[i] for i in sorted(changed)]


class HeldStateCheck:
    """The job-wide verdict over every rank's seal (a collective: every rank calls it at the same steps)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, rank: int, world_size: int,
                 control: ControlGroups, enabled: bool):
        self.rank, self.world_size, self.control, self.enabled = rank, world_size, control, enabled
        self.held = HeldStateSeal(model, optimizer)

    def seal(self) -> None:
        if self.enabled:
            self.held.seal()

    def verify(self, when: str) -> None:
        """Raise SilentDataCorruption on every rank if any rank's held state changed since its seal;
        seal first if nothing is sealed yet (the state just built or loaded)."""
        if not self.enabled:
            return
        if self.held.sealed is None:
            self.held.seal()
        changed = self.held.changed()
        flags = torch.zeros(self.world_size, dtype=torch.int64)
        flags[self.rank] = 1 if changed else 0
        bad = torch.nonzero(self.control.all_reduce(flags)).flatten().tolist()
        if not bad:
            return
        reports: list = [None] * self.world_size  # only when something changed: which tensors, every rank's
        self.control.all_gather_object(reports, changed)
        what = "; ".join(f"rank {r}: {', '.join(reports[r][:3])}{' ...' if len(reports[r]) > 3 else ''}"
                         for r in bad)
        raise SilentDataCorruption(f"state held at rest changed {when} (corrupted ranks: {bad}; {what}): "
                                   f"restoring the last checkpoint")
