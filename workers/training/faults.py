"""Injected faults for testing recovery: crash, hang, slow, nan (poisoned loss), spike (scaled loss), bitflip.

Each fault but `slow` fires once per job and step: it leaves a marker object under the
job's storage (`faults/`) before it fires, so a restarted group does not fire it again (nan and
spike may last `steps` consecutive steps, each step firing once).

A slow fault models a degraded node: from its step on, rank `rank` is slow while it
runs on the node where the fault first struck (recorded in its marker). A rank restarted
on the same node stays slow (a smaller share of the batch does not cure the node); a rank moved
to another node is not. Each attempt of a slow rank records where it ran
(`SlowRun`), so a verdict on its detection can tell a rank that stayed on the node from one that left.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from workers.spec import FaultSpec
from workers.storage import Storage

if TYPE_CHECKING:  # a program's rank injects faults without importing torch
    import torch
    from torch import nn

    from workers.checkpointing.transfer import Throttle


def this_node() -> str:
    """The Ray node this process runs on ("local" outside Ray)."""
    try:
        import ray

        if ray.is_initialized():
            return ray.get_runtime_context().get_node_id()
    except Exception:  # not in a Ray worker
        pass
    return "local"


SLOW_RUN_PREFIX = "slow-run-"


@dataclass(frozen=True)
class SlowRun:
    """One attempt of a slow fault's rank, from its first step at or past the fault: where it ran,
    whether that is the degraded node, and when (wall clock)."""

    fault: int
    node: str
    degraded: bool
    step: int
    at: float


def slow_runs(markers: Storage, fault: int) -> list[SlowRun]:
    """The recorded attempts of slow fault `fault`'s rank (markers: the job's `faults/`), oldest first."""
    runs = [SlowRun(**json.loads(markers.read_text(name))) for name in markers.list()
            if name.startswith(f"{SLOW_RUN_PREFIX}{fault}-")]
    return sorted(runs, key=lambda r: r.at)


class FaultInjector:
    def __init__(self, faults: list[FaultSpec], rank: int, job: Storage | str | os.PathLike,
                 node: str | None = None):
        self.rank, self.markers = rank, Storage.of(job) / "faults"
        self.faults = [(i, f) for i, f in enumerate(faults) if f.rank == rank]
        self._slow_node: dict[int, str] = {}  # slow fault -> the node it degraded
        self.node = node if node is not None else (this_node() if any(f.kind == "slow" for _, f in self.faults)
                                                   else "local")

    @staticmethod
    def _marker(index: int, step: int | None = None) -> str:
        return f"fired-{index}" if step is None else f"fired-{index}-{step}"

    def _write_marker(self, name: str, text: str) -> None:
        self.markers.write_text(name, text)

    def fires(self, step: int, kind: str, during: str = "step") -> bool:
        """True (once) when a fault of `kind` is due at this 1-based step on this rank (`during`: in which
        part of it: the step, or the final validation after the last step)."""
        for index, fault in self.faults:
            if fault.kind != kind or fault.during != during or not fault.at_step <= step < fault.at_step + fault.steps:
                continue
            marker = self._marker(index) if fault.steps == 1 else self._marker(index, step)
            if not self.markers.exists(marker):
                self._write_marker(marker, f"{kind} at step {step} on rank {self.rank}\n")
                print(f"[fault-injection] {kind} at step {step} on rank {self.rank}", flush=True)
                return True
        return False

    def in_final_validation(self, step: int, done: int, total: int) -> None:
        """Called as the final validation after step `step` advances: a crash fault `during: final_validation`
        strikes halfway through it (after the last step's checkpoint, before the validation is recorded)."""
        if 2 * done >= total and self.fires(step, "crash", during="final_validation"):
            os._exit(17)

    def before_step(self, step: int) -> None:
        """Called with the 1-based step about to run."""
        if self.fires(step, "crash"):
            os._exit(17)
        if self.fires(step, "hang"):
            while True:  # the supervisor's hang timeout must notice
                time.sleep(3600)

    def spike_factor(self, step: int) -> float:
        """The factor to multiply this step's loss by (1.0: no spike)."""
        factors = [f.factor for _, f in self.faults if f.kind == "spike" and f.at_step <= step < f.at_step + f.steps]
        return max(factors) if factors and self.fires(step, "spike") else 1.0

    def slow_factor(self, step: int) -> float:
        factors = [1.0]
        for index, fault in self.faults:
            if fault.kind != "slow" or step < fault.at_step:
                continue
            if index not in self._slow_node:  # read once: the marker never changes after it is written
                self._slow_node[index] = self._slow_marker(index, step, fault.factor)
                run = SlowRun(index, self.node, self._slow_node[index] == self.node, step, time.time())
                self._write_marker(f"{SLOW_RUN_PREFIX}{index}-{time.time_ns()}.json", json.dumps(asdict(run)))
            if self._slow_node[index] == self.node:
                factors.append(fault.factor)
        return max(factors)

    def _slow_marker(self, index: int, step: int, factor: float) -> str:
        marker = self._marker(index)
        if not self.markers.exists(marker):  # the node this rank runs on now is the one that degrades
            self._write_marker(marker, self.node)
            print(f"[fault-injection] slow x{factor} from step {step} on rank {self.rank} "
                  f"(node {self.node})", flush=True)
        return self.markers.read_text(marker).strip()

    def upload_throttle(self, step: int) -> Throttle | None:
        """kind=slow_upload / stall_upload, due at the checkpoint of this step on this rank (once per job):
        the rank's part of it takes `factor` seconds to write, progressing, or stops halfway."""
        from workers.checkpointing.transfer import Throttle

        for kind in ("slow_upload", "stall_upload"):
            seconds = max((f.factor for _, f in self.faults if f.kind == kind and f.at_step == step), default=None)
            if seconds is not None and self.fires(step, kind):
                return Throttle(seconds, stall=kind == "stall_upload")
        return None

    def exhaust_memory(self, step: int, device: torch.device) -> None:
        """kind=oom: allocate more than any machine has (a PiB), through the allocator the rank trains with,
        so that its out-of-memory error is the real one (CPU: the default allocator's; CUDA: torch's)."""
        if self.fires(step, "oom"):
            import torch

            torch.empty(2**50, dtype=torch.uint8, device=device)

    def flip_a_bit(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> str | None:
        """Silent data corruption at rest (after the update, before the next forward): flip one mantissa bit
        (bit 12 of the fp32 word: the value changes by about 2^-11 of itself) in state this rank owns.
        `target: parameters`: in its own part of a parameter: the rows its ZeRO-1/2 optimizer updates and then
        all-gathers to every replica, its local shard (FSDP, HSDP, TP), its stages' (pipeline), its replica
        (DDP). `target: optimizer`: in its own optimizer state (ZeRO and FSDP: its shard of AdamW's moments).
        The element flipped is the largest in magnitude there, so that the flip is never lost on a zero.
        Returns what it flipped (None when no flip is due)."""
        due = [f for _, f in self.faults if f.kind == "bitflip" and f.at_step <= step < f.at_step + f.steps]
        if not due or not self.fires(step, "bitflip"):
            return None
        import torch

        name, region = (_owned_optimizer_state(optimizer) if due[0].target == "optimizer" and optimizer is not None
                        else _owned_parameter_rows(model, optimizer))
        with torch.no_grad():
            flat = region.reshape(-1)  # a view: every region is contiguous
            i = int(flat.abs().argmax())
            flat[i: i + 1].view(torch.int32).bitwise_xor_(1 << 12)
        what = f"{name}[{i}] ({due[0].target})"
        print(f"[fault-injection] bit flipped in {what} on rank {self.rank}", flush=True)
        return what


# --- bitflip: where this rank owns state (found apart from workers/training/shard_integrity.py's list of
# what it checks, so that a test of one is not the other's mirror) -------------------------------------


def _local(t: torch.Tensor) -> torch.Tensor:
    return getattr(t, "_local_tensor", t)


def _owned_parameter_rows(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> tuple[str, torch.Tensor]:
    """The first fp32 parameter with a nonzero element this rank owns, and its owned part (a view). Where some
    parameters are sharded DTensors (TP, FSDP), one of those: a tensor replicated over tp is every tp rank's."""
    import torch

    from workers.parallel.zero_optimizer import ShardedAdamW, _rows

    params = list(model.named_parameters())
    sharded = [(n, p) for n, p in params if any(pl.is_shard() for pl in getattr(p, "placements", ()))]
    for name, p in sharded or params:
        if p.dtype != torch.float32:
            continue
        if isinstance(optimizer, ShardedAdamW) and p.dim() > 0:  # whole on every rank; its rows are its own
            _, lo, hi = _rows(p.shape[0], optimizer.k, optimizer.r)
            region = p.data[lo:hi]
        else:
            region = _local(p.data)
        if region.numel() and bool(region.ne(0).any()):
            return name, region
    raise RuntimeError("bitflip: this rank owns no nonzero fp32 parameter element")


def _owned_optimizer_state(optimizer: torch.optim.Optimizer) -> tuple[str, torch.Tensor]:
    """The first fp32 optimizer state tensor (not a step count) with a nonzero element on this rank (local)."""
    import torch

    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in optimizer.state.get(p, {}).items():
                region = _local(value) if isinstance(value, torch.Tensor) else None
                if (region is not None and region.dtype == torch.float32 and region.dim() > 0 and region.numel()
                        and bool(region.ne(0).any())):
                    return key, region
    raise RuntimeError("bitflip: this rank holds no nonzero fp32 optimizer state")
