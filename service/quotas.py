"""Per-tenant quotas: at submit (429 or accepted to wait); at admission the scheduler's policy applies them.

The server caps every tenant's open (queued or running) jobs (`max_active_jobs_per_tenant`); a
tenant may also cap its queued jobs (`max_queued_jobs`) and the workers its jobs hold at once
(`max_workers`). With `quota_mode: reject` a submit whose workers, added to everything the
tenant already has queued or running, would pass `max_workers` is refused with 429, so its
jobs never wait on the quota; with `queue` it is accepted and waits until the tenant's
running jobs leave room. Either way the scheduler never admits past `max_workers`, and a
tenant held back by its own quota never holds back other tenants' jobs: the policy
(service/queueing/policy.py) sets such a tenant aside for the pass after one look, however
long its backlog.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from service.db import repository as repo
from service.db import tenant_usage as usage_repo
from service.db.models import Tenant
from service.refusals import NeverFits, OverQuota

QUOTA_MODES = ("reject", "queue")


class NeverWithinQuota(NeverFits):
    """The job alone asks for more workers than the tenant may ever hold."""


def locked_usage(s: Session, tenant_id: str) -> tuple[Tenant | None, usage_repo.Usage]:
    """The tenant, row-locked, and its usage: read once per transaction. The submits that share a
    transaction (service/db/group_commit.py) then count each other through `Usage.add_queued`."""
    cache = s.info.setdefault("tenant_usage", {})
    if tenant_id not in cache:
        # No flush first: what this transaction added so far belongs to other tenants (the batch
        # runs sorted by tenant), so the batch's inserts still leave together at commit.
        with s.no_autoflush:
            cache[tenant_id] = (usage_repo.lock_tenant(s, tenant_id), usage_repo.tenant_usage(s, tenant_id))
    return cache[tenant_id]


def prepare_submits(s: Session, submits: list[tuple[str, str | None]]) -> None:
    """A group-commit batch's submits, (tenant id, idempotency key) each, prepared at once: all
    their tenants locked (in id order, so concurrent batches cannot deadlock) and their usage read
    in one statement each, and all their keys looked up in one. `locked_usage` and
    `repo.find_by_idempotency_key` then answer from this transaction's cache."""
    tenant_ids = sorted({tenant_id for tenant_id, _ in submits})
    cache = s.info.setdefault("tenant_usage", {})
    with s.no_autoflush:  # nothing added yet: the batch's inserts leave together at commit
        tenants = {t.id: t for t in usage_repo.lock_tenants(s, tenant_ids)}
        usage = usage_repo.tenants_usage(s, tenant_ids)
        for tenant_id in tenant_ids:
            cache[tenant_id] = (tenants.get(tenant_id), usage[tenant_id])
        repo.prefetch_idempotency_keys(s, [(tenant_id, key) for tenant_id, key in submits if key is not None])


def check_submit(tenant: Tenant, usage: usage_repo.Usage, workers: int, max_open_jobs: int | None = None) -> None:
    """Every quota a submit of `workers` must pass: the server's cap on a tenant's open jobs
    (`max_open_jobs`), then the tenant's own. OverQuota (429) or NeverWithinQuota (422) if it fails."""
    if max_open_jobs is not None and usage.open_jobs >= max_open_jobs:
        raise OverQuota(repo.quota_message(max_open_jobs))
    cap = tenant.max_workers
    if cap is not None and workers > cap:
        raise NeverWithinQuota(f"resources.workers: the job needs {workers} workers but tenant {tenant.name!r} "
                               f"may hold at most {cap} at once (its max_workers quota)", "resources.workers")
    if tenant.max_queued_jobs is not None and usage.queued >= tenant.max_queued_jobs:
        raise OverQuota(f"quota: tenant {tenant.name!r} has {usage.queued} queued jobs, its "
                        f"max_queued_jobs quota; wait for some to start or cancel them")
    held = usage.active_workers + usage.queued_workers
    if cap is not None and tenant.quota_mode == "reject" and held + workers > cap:
        raise OverQuota(
            f"quota: tenant {tenant.name!r} has {usage.active_workers} workers running and {usage.queued_workers} "
            f"queued; {workers} more would pass its max_workers quota of {cap} (quota_mode reject)")
