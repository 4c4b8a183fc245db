"""The simulator's figures, read from the service's own database after (and during) the run."""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime

from sqlalchemy import func, select

from service.db.engine import make_engine, make_sessionmaker
from service.db.models import Job, JobEvent, Tenant


class FleetDatabase:
    def __init__(self, url: str):
        self.engine = make_engine(url)
        self.sessions = make_sessionmaker(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    def states(self) -> dict[str, int]:
        with self.sessions() as s:
            return {str(state): n for state, n in s.execute(select(Job.state, func.count()).group_by(Job.state))}

    def admission_latencies(self, job_ids: list[str]) -> dict[str, float | None]:
        """Seconds from submit to admission (STARTING) of each job; None if it was not admitted."""
        with self.sessions() as s:
            rows = s.execute(select(Job.id, Job.created_at, Job.started_at).where(Job.id.in_(job_ids))).all()
        return {i: (started - created).total_seconds() if started else None for i, created, started in rows}

    def job(self, job_id: str) -> tuple[str, datetime, datetime | None, datetime | None]:
        """state, submitted, admitted, running since (the first RUNNING event)."""
        with self.sessions() as s:
            job = s.get(Job, job_id)
            assert job is not None, f"job {job_id} is not in the database"
            running = s.scalar(select(func.min(JobEvent.ts)).where(JobEvent.job_id == job_id,
                                                                  JobEvent.state == "RUNNING"))
            return str(job.state), job.created_at, job.started_at, running

    def events(self, job_id: str) -> list[str]:
        """The job's events, as `kind: message` lines (what the simulator prints of the big job)."""
        with self.sessions() as s:
            rows = s.execute(select(JobEvent.kind, JobEvent.message).where(JobEvent.job_id == job_id)
                             .order_by(JobEvent.id)).all()
        return [f"{kind}: {message}" for kind, message in rows]

    def reservations(self, resource: str = "gpus") -> list[tuple[float, float, float]]:
        """Each reservation the scheduler made, as (from, until, GPUs held; or CPUs: resource 'cpus') in wall
        seconds: from its `reserved` event until its job was admitted (or until now, if it still waits)."""
        with self.sessions() as s:
            rows = s.execute(select(JobEvent.ts, JobEvent.data, Job.started_at).join(Job, Job.id == JobEvent.job_id)
                             .where(JobEvent.kind == "reserved").order_by(JobEvent.ts)).all()
        now = time.time()
        return [(ts.timestamp(), started.timestamp() if started else now, float((data or {}).get(resource, 0.0)))
                for ts, data, started in rows]

    def admitted_between(self, start: datetime, end: datetime, exclude: str) -> int:
        with self.sessions() as s:
            return s.scalar(select(func.count()).where(Job.started_at >= start, Job.started_at < end,
                                                       Job.id != exclude)) or 0

    def starved_tenants(self, window_start: datetime, window_end: datetime, queued_at_start: set[str]) -> list[str]:
        """Tenants with jobs queued all along, none admitted in the window, not held back by their own
        max_workers quota (a tenant at its quota waits on itself: that is the quota working)."""
        with self.sessions() as s:
            tenants = {t.id: t for t in s.scalars(select(Tenant))}
            admitted = Counter(s.scalars(select(Job.tenant_id).where(Job.started_at >= window_start,
                                                                     Job.started_at < window_end)))
            held: Counter[str] = Counter()
            for tenant_id, workers in s.execute(select(Job.tenant_id, Job.world_size).where(
                    Job.state.in_(("STARTING", "RUNNING", "RECOVERING")))):
                held[tenant_id] += workers
            smallest = dict(s.execute(select(Job.tenant_id, func.min(Job.world_size)).where(
                Job.state == "QUEUED").group_by(Job.tenant_id)).all())
        starved = []
        for tenant_id in queued_at_start:
            cap = tenants[tenant_id].max_workers
            at_quota = cap is not None and held[tenant_id] + smallest.get(tenant_id, 0) > cap
            if admitted[tenant_id] == 0 and tenant_id in smallest and not at_quota:
                starved.append(tenants[tenant_id].name)
        return sorted(starved)

    def forming(self) -> list[tuple[str, int, float, float]]:
        """(job id, supervisor epoch, GPUs, CPUs) of the admitted jobs whose group may not exist yet."""
        with self.sessions() as s:
            return [(i, epoch, float(gpus), float(cpus)) for i, epoch, gpus, cpus in s.execute(
                select(Job.id, Job.supervisor_epoch, Job.gpus, Job.cpus)
                .where(Job.state.in_(("STARTING", "RECOVERING"))))]

    def tenants_with_queued(self) -> set[str]:
        with self.sessions() as s:
            return set(s.scalars(select(Job.tenant_id).where(Job.state == "QUEUED").distinct()))
