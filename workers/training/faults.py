"""Injected faults for testing recovery: crash, hang, slow, nan (poisoned loss), spike (scaled loss), bitflip.

Each fault but `slow` fires once per job and step: it leaves a marker object under the
job's storage (`faults/`) before it fires, so a restarted group does not fire it again (nan and
spike may last `steps` consecutive steps, each step firing once).

A slow fault models a degraded node: from its step on, rank `rank` is slow while it
runs on the node where the fault first struck (recorded in its marker). A rank restarted
on the same node stays slow (a rebalance does not cure the node); a rank moved to another
node (the `replace` straggler policy) is not. Each attempt of a slow rank records where it ran
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
    from torch import nn


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

    def fires(self, step: int, kind: str) -> bool:
        """True (once) when a fault of `kind` is due at this 1-based step on this rank."""
        for index, fault in self.faults:
            if fault.kind != kind or not fault.at_step <= step < fault.at_step + fault.steps:
                continue
            marker = self._marker(index) if fault.steps == 1 else self._marker(index, step)
            if not self.markers.exists(marker):
                self._write_marker(marker, f"{kind} at step {step} on rank {self.rank}\n")
                print(f"[fault-injection] {kind} at step {step} on rank {self.rank}", flush=True)
                return True
        return False

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

    def flip_a_bit(self, step: int, model: nn.Module) -> None:
        import torch

        """Silent data corruption: flip one mantissa bit of one parameter on this replica only."""
        if self.fires(step, "bitflip"):
            with torch.no_grad():
                param = next(p for p in model.parameters() if p.dtype == torch.float32)
                local = getattr(param, "_local_tensor", param)
                local.view(-1)[:1].view(torch.int32).bitwise_xor_(1 << 12)
