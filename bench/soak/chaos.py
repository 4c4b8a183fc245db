"""The seeded chaos schedule and the injectors of the faults that hit the cluster or the control plane
(rank crashes, hangs and slow ranks ride in the jobs' own specs: bench/soak/jobs.py).

Faults run one at a time, each at its drawn time or as soon as the one before it has recovered: every
recovery is measured alone. Each injector returns the FaultRecord with its recovery time filled in."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from bench.soak import hostile, progress
from bench.soak.cluster import RayNodes
from bench.soak.jobs import JobPlan
from bench.soak.ledger import FaultRecord
from bench.soak.postgres import PrivatePostgres
from bench.soak.replicas import Api, Replicas

CLUSTER_FAULTS = ("node", "supervisor", "leader", "postgres", "submit_burst", "hostile")
RECOVERY_TIMEOUT_S = 300.0
ROUND_S = 240.0  # one of every fault per this much chaos time (at least one of each)


@dataclass(frozen=True)
class Planned:
    at_s: float  # seconds after the chaos starts
    kind: str


def schedule(rng: random.Random, window_s: float) -> list[Planned]:
    """Every kind once per round, at uniformly drawn times within the window."""
    rounds = max(1, int(window_s // ROUND_S))
    kinds = [k for _ in range(rounds) for k in CLUSTER_FAULTS]
    return sorted((Planned(rng.uniform(0, window_s), k) for k in kinds), key=lambda p: p.at_s)


class Chaos:
    def __init__(self, rng: random.Random, api: Api, replicas: Replicas, nodes: RayNodes, pg: PrivatePostgres,
                 submit: "Submit", hostile_token: str, victim: str):
        self.rng, self.api, self.replicas, self.nodes, self.pg = rng, api, replicas, nodes, pg
        self.submit, self.token, self.victim = submit, hostile_token, victim

    def inject(self, kind: str) -> FaultRecord | None:
        """The fault's record; None when there was nothing for it to hit (not a fault injected)."""
        return getattr(self, f"_{kind}")()

    def _recovered(self, kind: str, touched: dict[str, int], detail: str, at: float) -> FaultRecord:
        done = progress.wait_progress(self.api, touched, RECOVERY_TIMEOUT_S) if touched else \
            progress.wait_api(self.api, RECOVERY_TIMEOUT_S)
        return FaultRecord(kind, at, done, list(touched), detail)

    def _node(self) -> FaultRecord:
        progress.wait_running(self.api, 60)
        touched = progress.running(self.api, 1)  # every job that is training now
        index = self.rng.randrange(len(self.nodes.workers))
        at = time.time()
        self.nodes.remove_one(index)
        time.sleep(self.rng.uniform(5, 15))  # the node is away a while, then returns
        self.nodes.add_one()
        return self._recovered("node", touched, f"worker node {index} removed for {time.time() - at:.0f} s", at)

    def _supervisor(self) -> FaultRecord | None:
        candidates = progress.wait_running(self.api, 60)
        if not candidates:
            return None
        job_id = self.rng.choice(sorted(candidates))
        name = self.api.get_json(f"/v1/jobs/{job_id}")["supervisor"]
        at = time.time()
        if name is None or not self.nodes.kill_actor(name):
            return None  # it finished in between
        return self._recovered("supervisor", {job_id: candidates[job_id]}, f"ray.kill {name}", at)

    def _leader(self) -> FaultRecord:
        progress.wait_running(self.api, 60)
        touched = progress.running(self.api, 1)  # every job that is training now
        leader = self.replicas.leader()
        if leader is None:
            return FaultRecord("leader", time.time(), None, [], "no replica held the lease")
        at = time.time()
        leader.kill()
        record = self._recovered("leader", touched, f"SIGKILL of the leader on port {leader.port}", at)
        try:
            leader.start(timeout=240)  # as its pod would be restarted
        except RuntimeError as exc:  # it did not come back: the soak goes on with one replica, and says so
            record.recovered_at = None
            record.detail += f"; the killed replica did not restart: {str(exc)[:300]}"
        return record

    def _postgres(self) -> FaultRecord:
        progress.wait_running(self.api, 60)
        touched = progress.running(self.api, 1)  # every job that is training now
        at = time.time()
        took = self.pg.restart()
        return self._recovered("postgres", touched, f"pg_ctl restart ({took:.1f} s)", at)

    def _submit_burst(self) -> FaultRecord:
        """Concurrent submits, each sent twice with one idempotency key: one job per key, none lost."""
        at = time.time()
        ok = self.submit.burst(n=4)
        return FaultRecord("submit_burst", at, time.time() if ok else None, [], "4 jobs x 2 concurrent sends")

    def _hostile(self) -> FaultRecord:
        at = time.time()
        before = sum(self.api.server_errors.values())
        bad = hostile.hand_written(self.api, self.token, self.victim)
        bad += hostile.fuzz(self.api, self.token, self.rng.randrange(1 << 30), examples=3)
        fives = sum(self.api.server_errors.values()) - before
        ok = not bad and not fives and progress.wait_api(self.api, 30) is not None
        return FaultRecord("hostile", at, time.time() if ok else None, [],
                           "; ".join(bad)[:500] or f"{fives} 5xx")


class Submit:
    """The stream's submits (used by the submitter thread and by the burst fault)."""

    def __init__(self, api: Api, code_dir: str, on_accepted):
        self.api, self.code_dir, self.on_accepted = api, code_dir, on_accepted
        self.burst_plans: list[JobPlan] = []
        self._count = 0
        self._lock = threading.Lock()

    def one(self, plan: JobPlan, key: str | None = None) -> str | None:
        headers = {"Idempotency-Key": key or plan.name}
        r = self.api.request("POST", "/v1/jobs", json=plan.spec(self.code_dir), headers=headers)
        if r.status_code in (200, 201):
            return r.json()["id"]
        self.on_accepted(plan, None, f"{r.status_code} {r.text[:200]}")
        return None

    def burst(self, n: int) -> bool:
        with self._lock:
            plans = [JobPlan("ddp", f"burst-{self._count + i:04d}-ddp", None) for i in range(n)]
            self._count += n
        sends = [p for p in plans for _ in range(2)]
        with ThreadPoolExecutor(len(sends)) as pool:
            ids = list(pool.map(self.one, sends))
        agreed = all(ids[2 * i] is not None and ids[2 * i] == ids[2 * i + 1] for i in range(n))
        for i, plan in enumerate(plans):
            if ids[2 * i] is not None:
                self.on_accepted(plan, ids[2 * i], None)
        return agreed
