"""Fakes of the run loop's own interfaces (service/supervisor/cluster.py), not of Ray: a cluster of
named nodes with worker slots, and worker groups whose ranks follow a per-attempt script."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass, field

from workers.checkpointing import checkpoint_root, step_name
from workers.events import RankCheckpoint, RankEvent, RankShares, RankStep, RestartCause
from workers.runtime.group import GroupFailure
from workers.spec import JobSpec
from workers.storage import Storage
from workers.training.control import UnevenShares


def empty_dcp_metadata() -> bytes:
    """A real DCP `.metadata` that names no shard files. torch is imported here, not at the top: the
    torch-free supervisor test (test_supervisor_torch_free.py) hands its bytes in from outside."""
    from torch.distributed.checkpoint.metadata import Metadata

    return pickle.dumps(Metadata({}))


class FakeCluster:
    def __init__(self, slots: dict[str, int]):
        self.slots = dict(slots)  # node -> worker slots
        self.used: dict[str, int] = {}

    def free_slots_per_node(self, bundle: dict[str, float]) -> dict[str, int]:
        return {node: n - self.used.get(node, 0) for node, n in self.slots.items()}

    def place(self, n: int) -> list[str]:
        nodes = []
        for node, free in self.free_slots_per_node({}).items():
            take = min(free, n - len(nodes))
            nodes += [node] * take
            self.used[node] = self.used.get(node, 0) + take
        assert len(nodes) == n, f"no room for {n} workers: {self.slots}, used {self.used}"
        return nodes

    def release(self, nodes: list[str]) -> None:
        for node in nodes:
            if node in self.used:  # a lost node's slots are gone, not given back
                self.used[node] -= 1

    def lose(self, node: str) -> None:
        del self.slots[node]
        self.used.pop(node, None)


@dataclass
class AttemptScript:
    """How one attempt's ranks behave. Each poll trains one step on every rank."""

    fail_at: int | None = None  # this step's poll ends in a lost rank
    lose_node: str | None = None  # ... and with it this node
    per_sample_s: tuple[float, ...] = ()  # each rank's compute time per sample (default: all equal)
    preempt_at: int | None = None  # the test asks the run to make room at this step
    ignores_stop: bool = False  # a program that never looks at should_stop()
    unpolled_steps: int = 0  # steps the surviving ranks trained after the last poll, before the failure showed


@dataclass
class Script:
    attempts: list[AttemptScript]
    total_steps: int
    checkpoint_every: int = 2
    metadata: Callable[[], bytes] = empty_dcp_metadata  # what each checkpoint's `.metadata` holds
    started: list[ScriptedGroup] = field(default_factory=list)


class ScriptedGroup:
    def __init__(self, script: Script, cluster: FakeCluster, spec: JobSpec, job: Storage, attempt: int):
        self.script, self.plan, self.cluster = script, script.attempts[attempt], cluster
        self.spec, self.job, self.ws = spec, Storage.of(job), spec.world_size
        self.nodes: list[str] = []
        self.results: list[dict | None] = []
        self.warm_workers, self.master = 0, ("127.0.0.1", 29500 + attempt)
        self.step = 0
        self.shares: list[int] | None = None
        self.asked_shares: list[int] | None = None
        self.stop_asked = self.stopped = False
        self.unpolled: list[RankEvent] | None = None  # once failed: the survivors' last reports

    def start(self, timeout_s: float, uneven: UnevenShares | None = None) -> list[dict]:
        self.nodes = self.cluster.place(self.ws)
        self.uneven = uneven
        self.shares = list(uneven.start) if uneven is not None and uneven.start else None
        done = sorted(int(name.split("-")[1]) for name in checkpoint_root(self.job).list() if name.startswith("step-"))
        self.step = done[-1] if done else 0  # resume from the latest durable checkpoint
        self.script.started.append(self)
        return [{"rank": r, "start_step": self.step} for r in range(self.ws)]

    def poll(self, timeout_s: float = 30.0) -> list[RankEvent]:
        if self.unpolled is not None:
            events, self.unpolled = self.unpolled, []
            return events
        if self.stopped or self.step >= self.script.total_steps:
            return []
        return self._train_step(range(self.ws))

    def _train_step(self, ranks: range) -> list[RankEvent]:
        self.step += 1
        events: list[RankEvent] = [RankStep(self._record(r)) for r in ranks]
        if self.asked_shares is not None:  # the ranks agree on the new split after this step
            self.shares, self.asked_shares = self.asked_shares, None
            events += [RankShares(r, self.step, tuple(self.shares)) for r in range(self.ws)]
        if self.step % self.script.checkpoint_every == 0 and self.step < self.script.total_steps:
            # a complete checkpoint of nothing: metadata that names no shard files
            (checkpoint_root(self.job) / step_name(self.step)).write_bytes(".metadata", self.script.metadata())
            events += [RankCheckpoint(r, self.step, 0.01) for r in ranks]
            self.stopped = self.stop_asked and not self.plan.ignores_stop  # preempted ranks stop at a checkpoint
        return events

    def check(self) -> bool:
        if self.plan.fail_at is not None and self.step >= self.plan.fail_at:
            if self.unpolled is None:  # the last rank dies; the others trained on, unpolled
                survivors = range(self.ws - 1)
                self.unpolled = [e for _ in range(self.plan.unpolled_steps) for e in self._train_step(survivors)]
            if self.plan.lose_node:
                self.cluster.lose(self.plan.lose_node)
            raise GroupFailure(f"rank {self.ws - 1} failed: ActorDiedError: the actor died",
                               cause=RestartCause.WORKER_LOST)
        if self.stopped:
            self.results = [{"stopped_at": self.step}] * self.ws
            return True
        if self.step >= self.script.total_steps:
            self.results = [{"step": self.step, "val_loss": 1.0 + r, "params_sha256": "abc"} for r in range(self.ws)]
            return True
        return False

    def request_stop(self) -> None:
        self.stop_asked = True

    def request_shares(self, version: int, shares: list[int]) -> None:
        self.asked_shares = shares

    def bundle(self) -> dict[str, float]:
        return {"CPU": 1.0}

    def shutdown(self) -> None:
        self.cluster.release(self.nodes)
        self.nodes = []

    def _record(self, rank: int) -> dict:
        dp, g = self.ws, self.spec.train.global_batch_size
        samples = self.shares[rank] if self.shares else g // dp
        per_sample = self.plan.per_sample_s[rank] if self.plan.per_sample_s else 0.005
        compute = samples * per_sample
        return {"step": self.step, "rank": rank, "loss": 3.0 / self.step, "step_time_s": compute + 0.01,
                "compute_time_s": compute, "comm_time_s": 0.01, "samples": samples, "tokens": samples * 16,
                "grad_norm": 1.0, "lr": 1e-3, "comm_bytes": 1024, "model_state_bytes": 2048, "skipped": False,
                "stage": None, "peak_memory_bytes": None, "ts": float(self.step)}
