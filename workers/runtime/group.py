"""WorkerGroup: one placement group, one TrainWorker actor per rank, one process group.

Teardown kills every actor and removes the placement group, whatever state the
group is in, so a failed or cancelled run leaves nothing behind in Ray.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import ray
from ray.util.placement_group import (
    PlacementGroup,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from workers.events import RankEvent, RankProgress, RestartCause
from workers.parallel.parameter_server.names import kill_named, shard_prefix
from workers.phases import Progress
from workers.program.prestarted import ENABLED as PRESTART
from workers.program.session_server import DRAIN_S
from workers.runtime.actor import TrainWorker
from workers.runtime.failure_reason import failure_reason
from workers.runtime.group_owner import GroupOwner
from workers.runtime.lost_ranks import LostRanks
from workers.runtime.node_leaders import node_leaders
from workers.runtime.node_loss import node_lost
from workers.runtime.pool import take_warm
from workers.spec import JobSpec
from workers.storage import Storage, client_env
from workers.training.control import UnevenShares
from workers.user_model_error import UserModelError


class GroupFailure(RuntimeError):
    """A rank died, raised, or the group could not form. `retryable` is False for bad configuration;
    `cause` says why, for the restart event and the metrics (never read back from the message)."""

    def __init__(self, message: str, retryable: bool = True, cause: RestartCause = RestartCause.ERROR):
        super().__init__(message)
        self.retryable, self.cause = retryable, cause


def restart_cause(exc: BaseException, default: RestartCause = RestartCause.ERROR) -> RestartCause:
    """Why a rank or the group failed, from the exception's type: a rank's own errors carry their
    cause (`restart_cause` on NonFiniteTraining, SilentDataCorruption)."""
    inner = getattr(exc, "cause", None)
    own = getattr(inner, "restart_cause", None)
    if isinstance(own, RestartCause):
        return own
    if isinstance(exc, (ray.exceptions.GetTimeoutError, TimeoutError)) or isinstance(inner, TimeoutError):
        return RestartCause.HANG
    if isinstance(exc, ray.exceptions.RayActorError) and not exc.actor_init_failed:
        return RestartCause.WORKER_LOST  # died, or unreachable (ActorUnavailableError): its call is lost
    return default


# How long the peers of a failed rank get to report theirs: a command rank's actor reports its end only
# after its session has drained (up to DRAIN_S), and the rank that died first must be among them.
PEER_GRACE_S = DRAIN_S + 1.0

# Errors that a restart cannot fix: the spec or the user's code is wrong.
CONFIGURATION_ERRORS = (ValueError, TypeError, ImportError, FileNotFoundError, KeyError)  # incl. UserModelError


class WorkerGroup(LostRanks):
    def __init__(self, spec: JobSpec, storage: Storage, attempt: int, owner: GroupOwner,
                 avoid_nodes: frozenset[str] = frozenset(), interrupted: Callable[[], bool] = lambda: False):
        self.spec, self.storage, self.attempt, self.owner = spec, Storage.of(storage), attempt, owner
        self.store_env = client_env()  # the supervisor's store variables, forwarded to every rank
        self.avoid_nodes = avoid_nodes  # degraded nodes no rank may be placed on (straggler `replace`)
        self.interrupted = interrupted  # the job is being cancelled: stop waiting on a node's verdict
        self.nodes: list[str] = []  # the node of each rank, once placed
        self.pg: PlacementGroup | None = None
        self.actors: list = []
        self.train_refs: list = []
        self.results: list[dict | None] = []
        self.warm_workers = 0
        self.master: tuple[str, int] | None = None  # the rank-0 TCP store
        self.leaders: dict[int, list[int]] = {}  # leader rank -> its node's ranks: the ranks a poll calls
        self.direct: set[int] = set()  # ranks polled themselves: their node's leader is gone
        self.calls_per_poll = 0
        self._delivered: dict[int, int] = {}  # follower -> seq of its last event a leader's poll gave us
        self._in_flight: dict[int, ray.ObjectRef] = {}  # rank -> its unanswered poll: one call at a time each
        self._early: list[RankEvent] = []  # reported while start() waited on the set-up
        self.timeout_s = 120.0  # start()'s, for a joining rank's set-up
        self._init_lost_ranks()

    @staticmethod
    def bundle_of(spec: JobSpec) -> dict[str, float]:
        r = spec.resources
        b = {"CPU": r.cpus_per_worker}
        if r.gpus_per_worker:
            b["GPU"] = r.gpus_per_worker
        return b

    def bundle(self) -> dict[str, float]:
        return self.bundle_of(self.spec)

    def start(self, timeout_s: float, uneven: UnevenShares | None = None) -> list[dict]:
        """Reserve resources, start the actors, rendezvous, load the latest checkpoint, begin training."""
        n = self.spec.world_size
        self.timeout_s = timeout_s
        # Every bundle avoids the degraded nodes: Ray's default node-id label, matched with "not in".
        selector = ([{"ray.io/node-id": f"!in({','.join(sorted(self.avoid_nodes))})"}] * n
                    if self.avoid_nodes else None)
        self.pg = pg = placement_group([self.bundle()] * n, strategy="PACK", name=self.owner.group_name(self.attempt),
                                       bundle_label_selector=selector)
        try:
            ray.get(pg.ready(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError as exc:
            raise GroupFailure(
                f"resources for {n} workers x {self.bundle()} not available within {timeout_s:.0f}s") from exc
        spec_json = self.spec.model_dump(mode="json")
        try:
            self._place_actors(timeout_s)
            hosted = (ray.get(self.actors[0].host_agent_store.remote(), timeout=timeout_s)
                      if not self._needs_training_stack() else None)
            addr, port = self.master = hosted or ray.get(self.actors[0].address.remote(), timeout=timeout_s)
            # Collectives time out well after the supervisor's own hang timer, so that a hang is
            # diagnosed as one (by the supervisor) rather than as a peer's collective error.
            collective_timeout = 2 * self.spec.fault_tolerance.hang_timeout_s + 30
            gpus = (ray.get([a.gpu_ids.remote() for a in self.actors], timeout=timeout_s)
                    if self.spec.program is not None and self.spec.resources.gpus_per_worker else None)
            setups = self._await_setups([a.setup.remote(spec_json, addr, port, collective_timeout, uneven,
                                                        self.attempt, self.nodes, gpus, hosted is not None)
                                         for a in self.actors], timeout_s)
        except ray.exceptions.RayTaskError as exc:
            retryable = not isinstance(exc.cause, CONFIGURATION_ERRORS)
            raise GroupFailure(f"group did not form: {failure_reason(exc)}", retryable,
                               restart_cause(exc, RestartCause.START)) from exc
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError) as exc:
            raise GroupFailure(f"group did not form: {failure_reason(exc)}",
                               cause=restart_cause(exc, RestartCause.START)) from exc
        self.train_refs = [a.train.remote() for a in self.actors]
        self.results = [None] * n
        return setups

    def _await_setups(self, refs: list, timeout_s: float, poll_s: float = 0.5) -> list[dict]:
        """Every rank's setup answer. Meanwhile the ranks' progress (opening the data, building the model,
        loading the checkpoint) is polled, kept for the supervisor's first poll(), and moves the deadline:
        a set-up fails after `timeout_s` without progress, not after `timeout_s` in all."""
        deadline, last = time.monotonic() + timeout_s, dict[int, Progress]()
        while True:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=poll_s)
            if len(ready) == len(refs):
                return ray.get(refs, timeout=timeout_s)
            ray.get(ready, timeout=timeout_s)  # a rank whose setup failed fails the group now
            for event in self.poll(poll_s):
                self._early.append(event)
                if isinstance(event, RankProgress) and event.progress.advanced_from(last.get(event.rank)):
                    last[event.rank] = event.progress
                    deadline = time.monotonic() + timeout_s
            if time.monotonic() > deadline:
                raise ray.exceptions.GetTimeoutError(f"no rank's set-up progressed for {timeout_s:.0f}s")

    def _place_actors(self, timeout_s: float) -> None:
        """One actor per bundle: a warm pooled worker on the bundle's node if there is one, else a fresh one."""
        n, r = self.spec.world_size, self.spec.resources
        bundle_nodes = placement_group_table(self.pg)["bundles_to_node_id"]
        self.nodes = [bundle_nodes[i] for i in range(n)]
        warm = take_warm(self.nodes) if not r.gpus_per_worker else [None] * n
        self.warm_workers = sum(name is not None for name in warm)
        actors, assigned = [], []
        for i, name in enumerate(warm):
            if name is not None:
                actor = ray.get_actor(name)
            else:
                # @ray.remote adds .options (mypy ignores class decorators)
                actor = TrainWorker.options(  # type: ignore[attr-defined]
                    num_cpus=r.cpus_per_worker, num_gpus=r.gpus_per_worker, max_restarts=0,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=i),
                ).remote(preload=self._needs_training_stack(), prestart=PRESTART and not self._needs_training_stack())
            actors.append(actor)
            assigned.append(actor.assign.remote(i, n, self.storage.uri, f"rank-{i}.log",
                                                self.pg if name is not None else None, self.store_env))
        self.actors = actors
        ray.get(assigned, timeout=timeout_s)
        self.appoint_leaders(timeout_s)

    def appoint_leaders(self, timeout_s: float) -> None:
        """One rank per node speaks for it (workers/runtime/node_leaders.py): the others hand it their events."""
        self.leaders = node_leaders(self.nodes)
        ray.get([self.actors[rank].follow.remote(self.actors[leader])
                 for leader, ranks in self.leaders.items() for rank in ranks[1:]], timeout=timeout_s)

    def _needs_training_stack(self) -> bool:
        """A command program runs in its own process: its actor needs no torch (a faster start)."""
        return self.spec.program is None or self.spec.program.command is None

    def poll(self, timeout_s: float = 30.0) -> list[RankEvent]:
        """Telemetry from every live rank since the last poll, one call per node (its leader's, which
        holds what the node's other ranks handed it). A rank that does not answer within `timeout_s`
        (all together) keeps its call in flight: its answer is taken by a later poll, not lost, and it
        gets no second call meanwhile. Once a leader is gone its node's other ranks are polled
        themselves, at once and from then on (workers/runtime/actor.py: they lose nothing it held)."""
        events, self._early = self._early, []  # what the ranks reported during their set-up
        targets = ([r for r in self.leaders if r not in self.direct] + sorted(self.direct) if self.leaders
                   else list(range(len(self.actors))))
        targets = [r for r in targets if r not in self.lost]
        self.calls_per_poll = len(targets)
        deadline = time.monotonic() + timeout_s
        while targets:
            fallen = self._collect_polls(targets, deadline, events)
            self.direct.update(fallen)
            self.calls_per_poll += len(fallen)
            targets = fallen  # polled in this same poll: their events are not held back a poll interval
        return events

    def _collect_polls(self, targets: list[int], deadline: float, events: list[RankEvent]) -> list[int]:
        """Poll `targets` (the calls still in flight from an earlier poll first); the followers of a
        leader found dead, to be polled themselves."""
        for rank in targets:
            if rank in self._in_flight:
                continue
            actor = self.actors[rank]
            if rank in self.direct:  # a follower whose leader is gone: what it handed over that we never got
                self._in_flight[rank] = actor.poll.remote(self._delivered.get(rank, 0))
            elif rank in self.leaders:
                self._in_flight[rank] = actor.poll_node.remote()
            else:
                self._in_flight[rank] = actor.poll.remote()
        refs = {self._in_flight[r]: r for r in targets}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=max(0.0, deadline - time.monotonic()))
        fallen: list[int] = []
        for ref in ready:
            rank = refs[ref]
            del self._in_flight[rank]
            try:
                answer = ray.get(ref, timeout=0)
            except ray.exceptions.RayActorError:  # a dead rank shows up in check(); its node's peers answer now
                fallen.extend(r for r in self.leaders.get(rank, ())[1:] if r not in self.direct)
                continue
            except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
                continue
            if isinstance(answer, tuple):  # a leader's: its node's events, and how far each follower's reached
                answer, delivered = answer
                self._delivered.update(delivered)
            events.extend(answer)
        return fallen

    def check(self) -> bool:
        """True once every rank finished; raises GroupFailure if any rank failed."""
        if self.joining:
            self._take_joiners()
        ready, _ = ray.wait(self.train_refs, num_returns=len(self.train_refs), timeout=0)
        failures = self._collect(ready)
        if failures and self.sheds_lost_ranks():
            failures = self._shed(failures)
        if failures:
            # Peers of a dead rank fail too (broken connections); give them a moment so the
            # report names the rank that died rather than the first peer to notice.
            ray.wait(self.train_refs, num_returns=len(self.train_refs), timeout=PEER_GRACE_S)
            failures = self._collect(self.train_refs)
            rank, exc = min(failures, key=_first_failure)
            retryable = not self._same_user_error(failures) and not _any_unfixable(failures)
            raise GroupFailure(f"rank {rank} failed: {failure_reason(exc)}", retryable, self._cause(rank, exc)) from exc
        done = all(res is not None for i, res in enumerate(self.results) if i not in self.lost)
        if done and self.lost and not any(r is not None and ("lead" in r or "stopped_at" in r) for r in self.results):
            # The live ranks finished but the one that led their final phases was lost in them: redo those.
            raise GroupFailure(f"the lead trainer was lost in the final phases ({', '.join(self.lost.values())})",
                               cause=RestartCause.WORKER_LOST)
        return done

    def _cause(self, rank: int, exc: ray.exceptions.RayError) -> RestartCause:
        """A rank lost with its node is the cluster's fault (node_lost), else the cause of its error."""
        cause = restart_cause(exc)
        if cause == RestartCause.WORKER_LOST:
            node = self.nodes[rank] if rank < len(self.nodes) else None
            if getattr(exc, "preempted", False) or node_lost(node, interrupted=self.interrupted):
                return RestartCause.NODE_LOST
        return cause

    def _same_user_error(self, failures: list[tuple[int, ray.exceptions.RayError]]) -> bool:
        """Every rank failed with the same model/data error: a restart would fail the same way."""
        causes = [getattr(exc, "cause", None) for _, exc in failures]
        return (len(failures) == len(self.train_refs)
                and all(isinstance(c, UserModelError) for c in causes) and len({str(c) for c in causes}) == 1)

    def _collect(self, refs: list) -> list[tuple[int, ray.exceptions.RayError]]:
        failures = []
        index = {ref: i for i, ref in enumerate(self.train_refs)}  # list.index per ref was quadratic in ranks
        for ref in refs:
            i = index[ref]
            if i in self.lost:
                continue
            try:
                self.results[i] = ray.get(ref, timeout=0)
            except ray.exceptions.GetTimeoutError:
                continue
            except ray.exceptions.RayError as exc:
                failures.append((i, exc))
        return failures

    def request_stop(self) -> None:
        for a in self.actors:
            a.request_stop.remote()

    def request_shares(self, version: int, shares: list[int]) -> None:
        """A new data split per dp rank; the ranks switch together at their next agreement step."""
        for a in self.actors:
            a.request_shares.remote(version, shares)

    def shutdown(self) -> None:
        if self.spec.program is not None and self.actors:  # a command's process group goes first
            try:
                ray.get([a.terminate.remote() for a in self.actors], timeout=15)
            except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
                pass  # a dead actor's program died with it (PR_SET_PDEATHSIG)
        for a in self.actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # already dead
                pass
        self._drop_joiners()
        self.actors, self.train_refs = [], []
        if self.pg is not None and self.spec.parallel.parameter_server is not None:
            try:  # detached, they would end with the placement group anyway: at once, and by name
                kill_named(shard_prefix(self.pg.id.hex()))
            except Exception:
                pass
        if self.pg is not None:
            try:
                remove_placement_group(self.pg)
            except Exception:
                pass
            self.pg = None


def _first_failure(failure: tuple[int, ray.exceptions.RayError]) -> tuple[bool, bool, float, int]:
    """Order failures by how likely each is the root cause: a dead actor, then a program killed from
    outside (SIGKILL), then the program that failed first, then the lowest rank."""
    rank, exc = failure
    cause = getattr(exc, "cause", None)
    return (not isinstance(exc, ray.exceptions.RayActorError), not getattr(cause, "killed", False),
            getattr(cause, "failed_at", math.inf), rank)


def _any_unfixable(failures: list[tuple[int, ray.exceptions.RayError]]) -> bool:
    """A program rank failed in a way no restart fixes (workers/program/errors.py)."""
    return any(getattr(getattr(exc, "cause", None), "retryable", True) is False for _, exc in failures)
