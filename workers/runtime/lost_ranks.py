"""The ranks a worker group trains on without, and the ones that take their places: the parameter server's
async trainers, which never meet after their set-up (docs/parallel.md, "A lost trainer under async").

A rank whose actor died is shed, not a failure of the group, while at least resources.min_workers (1 when
unset) ranks live: the shards are told to wait no more for it, and the supervisor hears of it (take_lost).
An elastic job's supervisor may then start a new rank in its place (rejoin): it sets up alone, in a process
group of its own, and joins the running shards; check() starts it training once its set-up answers
(take_joined)."""

from __future__ import annotations

from typing import Any

import ray
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from workers.parallel.parameter_server.names import shard_prefix, tell_lost
from workers.runtime.actor import TrainWorker
from workers.runtime.failure_reason import failure_reason
from workers.spec import JobSpec
from workers.storage import Storage


class LostRanks:
    """WorkerGroup's part for lost and joining ranks (a mixin over the group's own state)."""

    spec: JobSpec
    storage: Storage
    store_env: dict[str, str]
    pg: PlacementGroup | None
    actors: list
    train_refs: list
    results: list[dict | None]
    nodes: list[str]
    direct: set[int]
    timeout_s: float
    _in_flight: dict[int, Any]
    _delivered: dict[int, int]

    def _init_lost_ranks(self) -> None:
        self.lost: dict[int, str] = {}  # rank -> why it was shed
        self.newly_lost: list[tuple[int, str]] = []  # shed, the supervisor not told yet (take_lost())
        self.joining: dict[int, tuple[Any, ray.ObjectRef]] = {}  # rank -> (its new actor, its set-up)
        self.newly_joined: list[tuple[int, int]] = []  # (rank, the step it joined at), not yet taken

    def sheds_lost_ranks(self) -> bool:
        """Whether a rank whose actor dies leaves the others training (parallel.parameter_server mode async:
        the trainers never meet after their set-up, and the shards outlive any of them), down to
        resources.min_workers live ranks (1 when unset)."""
        ps = self.spec.parallel.parameter_server
        return self.spec.program is None and ps is not None and ps.mode == "async"

    def take_lost(self) -> list[tuple[int, str]]:
        lost, self.newly_lost = self.newly_lost, []
        return lost

    def take_joined(self) -> list[tuple[int, int]]:
        joined, self.newly_joined = self.newly_joined, []
        return joined

    def rejoin(self, rank: int) -> None:
        """Start a new rank in lost rank `rank`'s place (its bundle of the placement group), which sets up alone
        and joins the running shards (async parameter server: an elastic join); check() starts it training
        once its set-up answers. Nothing waits here."""
        if rank not in self.lost or rank in self.joining or self.pg is None:
            return
        r = self.spec.resources
        actor = TrainWorker.options(  # type: ignore[attr-defined]
            num_cpus=r.cpus_per_worker, num_gpus=r.gpus_per_worker, max_restarts=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=rank),
        ).remote(preload=True)
        setup = actor.rejoin.remote(rank, len(self.train_refs), self.storage.uri, f"rank-{rank}.log", self.store_env,
                                    self.spec.model_dump(mode="json"), self.timeout_s * 2, self.nodes)
        self.joining[rank] = (actor, setup)

    def _take_joiners(self) -> None:
        """Joining ranks whose set-up answered: training from now on (or, if it failed, still lost)."""
        for rank, (actor, setup) in list(self.joining.items()):
            ready, _ = ray.wait([setup], timeout=0)
            if not ready:
                continue
            del self.joining[rank]
            try:
                answer = ray.get(setup, timeout=0)
            except ray.exceptions.RayError:  # it stays lost; the actor goes
                try:
                    ray.kill(actor, no_restart=True)
                except Exception:
                    pass
                continue
            self.actors[rank] = actor
            self.train_refs[rank] = actor.train.remote()  # type: ignore[attr-defined]
            self.results[rank] = None
            self._in_flight.pop(rank, None)
            self._delivered.pop(rank, None)
            self.direct.add(rank)  # polled itself: it follows no leader
            del self.lost[rank]
            self.newly_joined.append((rank, int(answer["start_step"])))

    def _shed(self, failures: list[tuple[int, ray.exceptions.RayError]]) -> list[tuple[int, ray.exceptions.RayError]]:
        """The failures that fail the group: not the deaths of ranks the others train on without (each is
        recorded as lost, and the shards are told not to wait for it)."""
        floor = self.spec.resources.min_workers or 1
        kept = []
        for rank, exc in failures:
            alive = len(self.train_refs) - len(self.lost)
            if isinstance(exc, ray.exceptions.RayActorError) and alive - 1 >= floor:
                reason = f"rank {rank} lost: {failure_reason(exc)}"
                self.lost[rank] = reason
                self.newly_lost.append((rank, reason))
                if self.pg is not None:  # its trainer index is its rank (the parameter server is dp only)
                    tell_lost(shard_prefix(self.pg.id.hex()), rank)
            else:
                kept.append((rank, exc))
        return kept

    def _drop_joiners(self) -> None:
        """The group ends: ranks still setting up to join go with it."""
        for actor, _ in self.joining.values():
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # already dead
                pass
        self.joining = {}
