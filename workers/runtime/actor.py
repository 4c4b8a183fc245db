"""TrainWorker: the Ray actor of one rank.

It is a threaded actor: `train` relays the loop (in a child process, workers/runtime/rank_process.py;
a command program's runner; or the loop itself with TRAINYARD_RANK_PROCESS=false) in one thread
while `poll` drains telemetry from another, so the supervisor sees every step live.
stdout/stderr of the process go to the job's per-rank log file.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING

import ray
from ray.util.placement_group import placement_group_table

from workers.events import RankEvent
from workers.os_thread_name import name_os_thread
from workers.runtime.rank_process import IN_CHILD, RankProcess, RankStart, start_trainer
from workers.runtime.step_aside import step_aside
from workers.storage import Storage, adopt_client_env
from workers.storage.log_output import capture_output, end_output
from workers.training.control import RankControl, UnevenShares

if TYPE_CHECKING:
    from workers.program.environment import Rendezvous
    from workers.program.prestarted import PrestartedPython
    from workers.program.runner import ProgramRunner
    from workers.training.trainer import Trainer

# A follower rank hands its events to its node's leader this often (when it has any): as often as the supervisor
# polls the leader (service/supervisor/run.py poll_interval_s). Handing over more often only adds calls: the
# follower's hand-over thread took 0.88 ms of CPU per 110 ms step of loop CPU at 0.1 s, 0.49 at 0.25 s
# (bench/overhead.py, docs/parallel.md), and the leader answers each call.
HAND_OVER_S = 0.25


def _exit_when_removed(pg, interval_s: float = 2.0) -> None:
    # A pooled worker is detached from its job's owner; tie its life to the job's placement group
    # so that a vanished supervisor cannot leave it orphaned.
    name_os_thread("pg-watch")
    while True:
        time.sleep(interval_s)
        try:
            state = placement_group_table(pg).get("state")
        except Exception:
            state = "REMOVED"
        if state == "REMOVED":
            os._exit(0)


@ray.remote(max_concurrency=4)
class TrainWorker:
    """Created either for one job (inside its placement group) or ahead of time by the warm pool."""

    def __init__(self, preload: bool = True, prestart: bool = False) -> None:
        from workers.runtime.warmup import import_training_stack

        self.prestarted: PrestartedPython | None = None
        if prestart:  # a command program's Python, importing torch beside this actor's own start
            from workers.program.prestarted import PrestartedPython
            self.prestarted = PrestartedPython()
        if preload:  # the slow part of a cold start, done before any job asks (not for a command program)
            import_training_stack()
        self._lock = threading.Lock()
        self._events: list[RankEvent] = []
        self.control = RankControl()  # stop and data-split requests, agreed on between steps
        self._leader = None  # this node's leading rank, which the supervisor polls for this one too
        self._following = threading.Event()  # set: stop handing over (reassigned, polled itself, or the job ended)
        self._handing = threading.Lock()  # one hand-over in flight, in order
        self._reset_relay()
        self.trainer: Trainer | RankProcess | ProgramRunner | None = None  # set by setup()

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def assign(self, rank: int, world_size: int, job_uri: str, log_name: str, pg=None,
               store_env: dict[str, str] | None = None) -> int:
        """Bind this process to one rank of one job, whose files live at `job_uri` (a local directory or
        an object store, reached with the forwarded `store_env`). With `pg`, exit once that placement
        group is gone."""
        adopt_client_env(store_env)
        self._following.set()  # a warm worker's earlier job: it no longer hands anything to that leader
        self._leader = None
        self._reset_relay()
        self.rank, self.world_size, self.storage = rank, world_size, Storage.at(job_uri)
        self.log_path = capture_output(self.storage, log_name)  # on an object store: a local file, shipped
        if pg is not None:
            threading.Thread(target=_exit_when_removed, args=(pg,), daemon=True).start()
        return os.getpid()

    def gpu_ids(self) -> list[str]:
        return [str(g) for g in ray.get_gpu_ids()]

    def address(self) -> tuple[str, int]:
        """This node's IP and a free port (asked of rank 0, which hosts the TCP store)."""
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def host_agent_store(self) -> tuple[str, int] | None:
        """For a command program, rank 0's actor hosts the ranks' TCP store, as torchrun's agent does, so that
        no rank's first connection finds it not yet listening and backs off. Only where torch is imported
        already (a warm worker): importing it here would delay a cold start more than it saves."""
        if "torch.distributed" not in sys.modules:
            return None
        from datetime import timedelta

        from torch.distributed import TCPStore

        addr = ray.util.get_node_ip_address()
        self._agent_store = TCPStore(addr, 0, is_master=True, wait_for_workers=False, timeout=timedelta(minutes=5))
        return addr, self._agent_store.port

    def setup(self, spec_json: dict, master_addr: str, master_port: int, timeout_s: float,
              uneven: UnevenShares | None = None, attempt: int = 0, nodes: list[str] | None = None,
              gpus: list[list[str]] | None = None, agent_store: bool = False) -> dict:
        from workers.spec import JobSpec

        spec = JobSpec.model_validate(spec_json)  # admitted at submit
        if self.prestarted is not None and (spec.program is None or spec.program.command is None):
            self.prestarted.close()  # only a command program runs in it
        if spec.program is not None:
            from workers.program.environment import Rendezvous

            return self._setup_program(spec, Rendezvous(master_addr, master_port, agent_store), timeout_s, attempt,
                                       nodes, gpus)
        start = RankStart(spec, self.rank, self.world_size, self.storage, master_addr, master_port, timeout_s, uneven,
                          tuple(nodes or ()))
        # TRAINYARD_RANK_PROCESS=false: the loop in this process, as before (a switch to rule it out); and a
        # parameter-server job's, whose loop calls its shard actors (a forked child never calls Ray).
        if not IN_CHILD or spec.parallel.parameter_server is not None:
            self.trainer, answer = start_trainer(start, self._emit)
            return answer
        self.trainer = process = RankProcess(start)
        step_aside()  # the loop, forked at this niceness, keeps it; this process only relays from now on
        return process.ready(self._emit)  # its set-up's progress, polled meanwhile (WorkerGroup.start)

    def rejoin(self, rank: int, world_size: int, job_uri: str, log_name: str, store_env: dict[str, str] | None,
               spec_json: dict, timeout_s: float, nodes: list[str] | None = None) -> dict:
        """Take the place of rank `rank` in a running job whose ranks train alone (the parameter server's async
        trainers: an elastic join): assign() and a set-up in a process group of this rank alone (its own TCP
        store), from the step the running shards give it. One call, so that nothing else is ordered before it."""
        from workers.spec import JobSpec

        self.assign(rank, world_size, job_uri, log_name, None, store_env)
        spec = JobSpec.model_validate(spec_json)
        addr, port = self.address()
        start = RankStart(spec, self.rank, self.world_size, self.storage, addr, port, timeout_s, None,
                          tuple(nodes or ()), join=True)
        self.trainer, answer = start_trainer(start, self._emit)
        return answer

    def _setup_program(self, spec, master: Rendezvous, timeout_s: float, attempt: int,
                       nodes: list[str] | None, gpus: list[list[str]] | None) -> dict:
        from workers.program.environment import RankPlace
        from workers.program.runner import program_runner

        place = RankPlace.of(self.rank, nodes or ["local"] * self.world_size, gpus)
        if self.rank == 0:
            print(f"[rank 0] the ranks meet at {master.addr}:{master.port}, a TCP store hosted by rank 0's "
                  f"{'actor' if master.agent_store else 'program'}", flush=True)
        self.trainer = program_runner(spec, place, self.storage, attempt, master, self.log_path, timeout_s,
                                      self.prestarted)
        return {"rank": self.rank, "start_step": 0, "device": "program"}

    def terminate(self) -> None:
        """Stop a program rank's processes before the actor goes (SIGTERM, then SIGKILL)."""
        terminate = getattr(self.trainer, "terminate", None)
        if terminate is not None:
            terminate()
        if self.prestarted is not None:
            self.prestarted.close()
        end_output()  # the actor is killed next, with no chance to ship its last lines

    def train(self) -> dict:
        try:
            assert self.trainer is not None, "setup() runs before train()"
            result = self.trainer.run(self._emit, self.control)
            print(f"[rank {self.rank}] finished: {result}", flush=True)
            return result
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
            raise
        finally:
            if self._leader is not None and not self._direct:  # the last events reach the leader before the
                self._following.set()                            # supervisor hears the end
                self._hand_over(self._leader)
            end_output()  # shipped before the supervisor hears the end (it kills this actor next)

    def _emit(self, event: RankEvent) -> None:
        with self._lock:
            self._events.append(event)

    # --- the node's leader polls for its ranks (workers/runtime/node_leaders.py) ----------------
    # A follower numbers what it hands over and keeps it until its leader says a supervisor poll took
    # it: if the leader dies first, the supervisor polls the follower itself (`poll(since)`) and gets
    # what the leader held unpolled, once, instead of losing it with the leader.

    def _reset_relay(self) -> None:
        self._direct = False  # polled by the supervisor itself: its leader is gone
        self._seq = 0  # of the last event this follower handed over
        self._sent: list[tuple[int, RankEvent]] = []  # handed over, not yet known to be polled off the leader
        self._held: dict[int, int] = {}  # leader: follower rank -> seq of its last event held here
        self._delivered: dict[int, int] = {}  # leader: follower rank -> seq of its last event a poll took

    def follow(self, leader) -> None:
        """Hand this rank's events to `leader` (this node's leading rank's actor) from now on."""
        self._leader, self._following = leader, threading.Event()
        threading.Thread(target=self._hand_over_loop, args=(leader, self._following), name="hand-over",
                         daemon=True).start()

    def relay(self, rank: int, seq: int, events: list[RankEvent]) -> int:
        """Follower `rank`'s events up to its `seq`, kept with this rank's own for the supervisor's next
        poll; answers the seq of that follower's last event a poll has taken."""
        with self._lock:
            self._events.extend(events)
            self._held[rank] = seq
            return self._delivered.get(rank, 0)

    def _hand_over_loop(self, leader, stop: threading.Event) -> None:
        name_os_thread("hand-over")
        while not stop.wait(HAND_OVER_S):
            self._hand_over(leader)

    def _hand_over(self, leader) -> None:
        """One hand-over, waited for: at most one in flight, in order."""
        with self._handing:
            with self._lock:
                if self._direct:
                    return
                events, self._events = self._events, []
                self._sent.extend(enumerate(events, self._seq + 1))
                self._seq += len(events)
                seq = self._seq
            if not events:
                return
            try:
                delivered = ray.get(leader.relay.remote(self.rank, seq, events), timeout=30)
            except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
                return  # the leader is gone: kept in _sent for the supervisor, which then polls this rank
            with self._lock:
                self._sent = [(s, e) for s, e in self._sent if s > delivered]

    def poll_node(self) -> tuple[list[RankEvent], dict[int, int]]:
        """A leader's poll: its own and its followers' events, and for each follower the seq of its last
        event among them (the supervisor asks a follower for what came after, should the leader die)."""
        with self._lock:
            events, self._events = self._events, []
            self._delivered.update(self._held)
            return events, dict(self._delivered)

    def poll(self, since: int | None = None) -> list[RankEvent]:
        """This rank's events. `since`: the supervisor polls a follower itself from now on (its leader is
        gone); first come the events it handed over after its `since`-th, which no poll took off the leader."""
        with self._lock:
            if since is not None:
                self._direct = True
                self._following.set()
            lost = [e for s, e in self._sent if s > since] if since is not None else []
            self._sent = [] if since is not None else self._sent
            events, self._events = self._events, []
        return lost + events

    def request_stop(self) -> None:
        self.control.request_stop()
        if isinstance(self.trainer, RankProcess):  # a loop in a child process hears it there
            self.trainer.request_stop()

    def request_shares(self, version: int, shares: list[int]) -> None:
        self.control.request_shares(version, shares)
        if isinstance(self.trainer, RankProcess):
            self.trainer.request_shares(version, shares)
