"""Admission of a submit: from the decoded request body to a committed QUEUED job and its audit record.

In order: the token's right to inject faults, the spec's own rules (pydantic; ValidationError),
whether the job could ever fit the cluster (its workers' CPUs and GPUs, and its predicted peak memory per
worker against the largest node's memory and resources.memory_per_worker_gib), then, in the
group-commit writer's transaction and under the tenant's row lock (so concurrent submits on any
replica cannot both take the last place): the idempotency key, the tenant's right to run user code,
the storage paths (and that uploaded code a program names is stored), every quota, and finally the
insert and its audit record. A refusal is a typed value (service/refusals.py) and writes nothing; the
API maps it to its HTTP answer.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service import quotas
from service.admission import gates
from service.admission.audit import SUBMIT, audit_record
from service.cluster_view import MEMORY
from service.db import audit_log as audit_repo
from service.db import repository as repo
from service.db.group_commit import GroupCommit
from service.db.models import Job
from service.records import JobRecord, Principal, copy_row
from service.refusals import Conflict, NeverFits, Unauthenticated
from service.scheduler import demand_of, never_fits
from service.settings import Settings
from workers.parallel.memory_fit import MemoryBudget, memory_view, memory_violation, node_budget, spec_budget
from workers.spec import JobSpec
from workers.spec_loading import parse_spec
from workers.storage import Storage


class Wake(Protocol):
    """The scheduler's wake-up: a threading.Event, or a multiprocessing one shared by the API workers."""

    def set(self) -> None: ...


@dataclass(frozen=True)
class Submission:
    caller: Principal
    body: dict  # the decoded JSON object: a JobSpec as the user wrote it
    priority: int = 0
    idempotency_key: str | None = None


@dataclass(frozen=True)
class Admitted:
    job: JobRecord
    created: bool  # False: an earlier submit with the same key and body, replayed
    memory: dict | None = None  # the predicted peak per worker and its budget, or why it is not predicted


class Admission:
    """`capacity()`: (cluster total, largest node) once known, else None; `wake`: set when a job
    is queued, so the scheduler looks at once."""

    def __init__(self, settings: Settings, writes: GroupCommit,
                 capacity: Callable[[], tuple[dict, dict] | None], wake: Wake):
        self.settings, self.writes, self.capacity, self.wake = settings, writes, capacity, wake

    async def submit(self, sub: Submission) -> Admitted:
        # Off the event loop: a `parallel: auto` spec runs the planner, and a Hugging Face model's memory is
        # predicted on the model built on the meta device (seconds, once per model, for the largest).
        spec, memory = await asyncio.to_thread(self._checked_and_predicted, sub)
        canonical = json.dumps({"spec": spec.model_dump(mode="json"), "priority": sub.priority}, sort_keys=True)
        write = _store(sub, spec, hashlib.sha256(canonical.encode()).hexdigest(), self.settings.storage,
                       self.settings.max_active_jobs_per_tenant)
        tenant = sub.caller.tenant_id
        for _ in range(2):
            try:
                job, created = await asyncio.wrap_future(
                    self.writes.submit(write, lock_order=tenant, hint=(tenant, sub.idempotency_key)))
                break
            except IntegrityError:  # the same key, committed meanwhile by another process: read its job
                if sub.idempotency_key is None:
                    raise
        else:
            raise Conflict("idempotency-key: concurrent submits with this key; retry")
        if created:
            self.wake.set()
        return Admitted(copy_row(JobRecord, job), created, memory)  # after commit: the row's defaults are filled in

    def _checked_and_predicted(self, sub: Submission) -> tuple[JobSpec, dict]:
        spec = self.checked_spec(sub)
        return spec, memory_view(spec, self._memory_budgets(spec))

    def _memory_budgets(self, spec: JobSpec) -> list[MemoryBudget | None]:
        capacity = self.capacity()
        return [spec_budget(spec), node_budget(capacity[1].get(MEMORY) if capacity is not None else None)]

    def checked_spec(self, sub: Submission) -> JobSpec:
        """The checks that need no database: NotAllowed, ValidationError or NeverFits."""
        gates.check_fault_injection_scope(sub.body, sub.caller.scopes)
        spec = parse_spec(sub.body, allow_fault_injection=self.settings.allow_fault_injection)
        capacity = self.capacity()
        if capacity is not None and (why := never_fits(demand_of(spec), *capacity)):
            raise NeverFits(why, "resources", f"the job can never run on this cluster: {why}")
        # The planner's predicted peak per worker (arithmetic for the built-in GPT; others built on the meta device).
        too_big = memory_violation(spec, self._memory_budgets(spec))
        if too_big is not None:
            raise NeverFits(too_big.message, too_big.field, f"the job can never run: {too_big.message}")
        return spec


def _store(sub: Submission, spec: JobSpec, body_sha: str, storage: Storage,
           max_open_jobs: int) -> Callable[[Session], tuple[Job, bool]]:
    """The submit's write, run with other submits in one transaction (service/db/group_commit.py)."""
    caller, key = sub.caller, sub.idempotency_key

    def audited(s: Session, job_id: str) -> None:  # commits with the job (one commit, not two)
        audit_repo.add_audit(s, **audit_record(caller, SUBMIT, 201, job_id, target_tenant_id=caller.tenant_id))

    def write(s: Session) -> tuple[Job, bool]:
        if key is not None and (existing := repo.find_by_idempotency_key(s, caller.tenant_id, key)):
            if existing.body_sha256 != body_sha:
                raise Conflict("idempotency-key: already used for a different job spec or priority; use a new key")
            audited(s, existing.id)
            return existing, False
        tenant, usage = quotas.locked_usage(s, caller.tenant_id)
        if tenant is None:  # deleted after the token was cached (auth_cache_s)
            raise Unauthenticated("authorization: this token's tenant no longer exists", "authorization")
        gates.check_user_code(spec, tenant)
        confined = gates.confine_paths(spec, storage,
                                       lambda job_id: repo.get_job(s, job_id, tenant_id=tenant.id) is not None)
        quotas.check_submit(tenant, usage, confined.world_size, max_open_jobs)
        job = repo.create_job(s, tenant.id, confined, sub.priority, body_sha, key, max_open_jobs=None)
        usage.add_queued(confined.world_size)
        audited(s, job.id)
        return job, True

    return write
