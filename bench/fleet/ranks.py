"""A simulated worker group: the run loop's `Group` (service/supervisor/cluster.py) on simulated ranks.

The supervisor's own JobRun drives it exactly as it drives `WorkerGroup` (workers/runtime/group.py):
start, poll, check, shutdown. Its ranks train one step per `step_s` of wall-clock time and report
the records a real rank reports (workers/telemetry.py StepRecord's fields); a poll makes the calls
WorkerGroup.poll makes: one per node, to the rank that leads it (workers/runtime/node_leaders.py). Checkpoints are
written as complete, empty ones on the job's storage, so a restart resumes from the latest.
"""

from __future__ import annotations

import pickle
import random
import threading
import time
from collections.abc import Callable

from torch.distributed.checkpoint.metadata import Metadata

from bench.fleet.nodes import Fleet, Group
from service.supervisor.resume_point import resume_step
from workers.checkpointing import checkpoint_root, step_name
from workers.events import RankCheckpoint, RankEvent, RankStep, RestartCause
from workers.runtime.group import GroupFailure
from workers.runtime.group_owner import GroupOwner
from workers.runtime.node_leaders import node_leaders
from workers.spec import JobSpec
from workers.storage import Storage
from workers.training.control import UnevenShares


class PollCounter:
    """Calls each supervisor's polls made, by job (the largest job's figure is reported)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.per_poll: dict[str, int] = {}  # job -> calls in its latest poll
        self.nodes: dict[str, int] = {}  # job -> nodes its ranks occupy in that poll
        self.total = 0

    def count(self, job_id: str, calls: int, nodes: int) -> None:
        with self.lock:
            self.per_poll[job_id], self.nodes[job_id] = calls, nodes
            self.total += calls


class SimulatedGroup:
    def __init__(self, fleet: Fleet, polls: PollCounter, spec: JobSpec, job: Storage, attempt: int,
                 owner: GroupOwner, step_s: float, slow_ranks: dict[int, float]):
        self.fleet, self.polls, self.spec, self.job = fleet, polls, spec, Storage.of(job)
        self.owner, self.attempt, self.step_s, self.slow_ranks = owner, attempt, step_s, slow_ranks
        self.ws = spec.world_size
        self.nodes: list[str] = []
        self.results: list[dict | None] = []
        self.warm_workers, self.master = 0, ("10.0.0.1", 29500)
        self.group: Group | None = None
        self.leaders: dict[int, list[int]] = {}
        self.step = self.first_step = 0
        self.t0 = 0.0
        self.stop_asked = False
        self.rng = random.Random(hash((owner.job_id, attempt)))

    def bundle(self) -> dict[str, float]:
        r = self.spec.resources
        return {"CPU": r.cpus_per_worker, "GPU": r.gpus_per_worker}

    def start(self, timeout_s: float, uneven: UnevenShares | None = None) -> list[dict]:
        self.group = self.fleet.request(self.owner.group_name(self.attempt), [self.bundle()] * self.ws)
        if not self.group.created.wait(timeout_s) or self.group.state != "CREATED":
            self.fleet.remove(self.group.group_id)
            raise GroupFailure(f"group did not form: placement group not created within {timeout_s:.0f}s",
                               cause=RestartCause.WORKER_LOST)
        self.nodes = list(self.group.nodes)
        self.leaders = node_leaders(self.nodes)
        self.step = self.first_step = resume_step(self.job, False)
        self.t0 = time.monotonic()
        return [{"rank": r, "start_step": self.step} for r in range(self.ws)]

    def poll(self, timeout_s: float = 30.0) -> list[RankEvent]:
        # one call per node, as WorkerGroup.poll makes
        self.polls.count(self.owner.job_id, len(self.leaders), len(set(self.nodes)))
        due = min(self.spec.train.steps, self.first_step + int((time.monotonic() - self.t0) / self.step_s))
        events: list[RankEvent] = []
        while self.step < due and not self.stop_asked:
            self.step += 1
            events += [RankStep(self._record(r)) for r in range(self.ws)]
            every = self.spec.checkpoint.every_steps
            if every and self.step % every == 0 and self.step < self.spec.train.steps:
                self._write_checkpoint()
                events += [RankCheckpoint(r, self.step, 0.05) for r in range(self.ws)]
        return events

    def check(self) -> bool:
        if self.group is not None and self.group.broken:
            node = next(n for n in self.nodes if not self.fleet.nodes[n].alive)
            raise GroupFailure(f"rank {self.nodes.index(node)} failed: its node {node[:12]} was lost",
                               cause=RestartCause.NODE_LOST)
        if self.stop_asked:
            self.results = [{"stopped_at": self.step}] * self.ws
            return True
        if self.step >= self.spec.train.steps:
            self.results = [{"step": self.step, "val_loss": 1.0, "params_sha256": "simulated"}] * self.ws
            return True
        return False

    def request_stop(self) -> None:
        self.stop_asked = True

    def request_shares(self, version: int, shares: list[int]) -> None:
        pass  # the simulated ranks' split does not change their speed

    def shutdown(self) -> None:
        if self.group is not None:
            self.fleet.remove(self.group.group_id)
            self.group = None

    def _write_checkpoint(self) -> None:
        # a complete checkpoint of nothing: metadata that names no shard files
        (checkpoint_root(self.job) / step_name(self.step)).write_bytes(".metadata", pickle.dumps(Metadata({})))

    def _record(self, rank: int) -> dict:
        g = self.spec.train.global_batch_size
        samples = max(1, g // self.ws)
        compute = 0.8 * self.step_s * self.slow_ranks.get(rank, 1.0) * (1.0 + 0.02 * self.rng.random())
        return {"step": self.step, "rank": rank, "loss": 4.0 / (1.0 + 0.01 * self.step), "step_time_s": self.step_s,
                "compute_time_s": compute, "comm_time_s": self.step_s - 0.8 * self.step_s, "samples": samples,
                "tokens": samples * 64, "grad_norm": 1.0, "lr": 1e-3, "comm_bytes": 4 << 20,
                "model_state_bytes": 64 << 20, "skipped": False, "stage": None, "peak_memory_bytes": None,
                "peak_memory_breakdown": None, "peak_activation_bytes": None, "peak_flops_per_s": None,
                "model_params": 10_000_000, "memory_tracked": False, "ts": time.time()}


def group_factory(fleet: Fleet, polls: PollCounter, step_s: float,
                  slow_ranks: Callable[[JobSpec], dict[int, float]]):
    """JobRun's `group_factory` for the simulated cluster."""

    def make(spec: JobSpec, job: Storage, attempt: int, owner: GroupOwner, avoid: frozenset[str],
             cancelled: Callable[[], bool]) -> SimulatedGroup:
        return SimulatedGroup(fleet, polls, spec, job, attempt, owner, step_s, slow_ranks(spec))

    return make
