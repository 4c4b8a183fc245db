"""The queueing policy (service/queueing/), pure: fair order by weight, priority within a tenant,
backfill, reservations, quotas, and its cost, on hand-built rows."""

from __future__ import annotations

import sys

import pytest

from service.queueing import QueuedJob, QueueIndex, Resources, TenantState, plan

NOW = 1_000_000.0


def job(id, tenant="a", priority=0, age=0.0, workers=1, cpus=None, gpus=0.0, waited=None):
    """A job submitted `age` seconds ago (its order) that entered QUEUED `waited` seconds ago (default: age)."""
    waited = age if waited is None else waited
    return QueuedJob(id, tenant, priority, NOW - age, NOW - waited, workers,
                     float(workers) if cpus is None else cpus, gpus)


USE_BOUNDS = True


@pytest.fixture(autouse=True, params=["bounds", "walk"])
def bounded(request, monkeypatch):
    """Every decision the same with the index's QueueBounds (what the scheduler passes) and without."""
    monkeypatch.setattr(sys.modules[__name__], "USE_BOUNDS", request.param == "bounds")


def run(jobs, free, tenants=(), total=None, reserve_after_s=300.0, reserved=None, never=None):
    index = QueueIndex(jobs)
    return plan(index.queues(), {t.id: t for t in tenants}, free, total or free, NOW, reserve_after_s,
                reserved=index.get(reserved), never=never,
                bounds=index.bounds if USE_BOUNDS else None)


def ids(jobs):
    return [j.id for j in jobs]


def test_tenants_take_turns_by_weighted_dominant_share():
    jobs = [job(f"a{i}", "a", age=100 - i) for i in range(8)] + [job(f"b{i}", "b", age=50 - i) for i in range(8)]
    out = run(jobs, Resources(8.0), [TenantState("a", weight=1), TenantState("b", weight=3)])
    admitted = ids(out.admit)
    assert len(admitted) == 8
    assert sum(i.startswith("b") for i in admitted) == 6  # 3:1 by weight
    assert admitted[:2] == ["a0", "b0"]  # equal shares: the tenant waiting longest goes first
    # what a tenant holds already counts: b holds 6 of 8 CPUs, so a catches up first
    out = run(jobs, Resources(4.0), [TenantState("a"), TenantState("b", held_cpus=6.0)], total=Resources(10.0))
    assert ids(out.admit)[:3] == ["a0", "a1", "a2"]


def test_gpus_dominate_a_gpu_tenant_and_cpus_a_cpu_tenant():
    total = Resources(cpus=100.0, gpus=10.0)
    gpu_heavy = TenantState("g", held_cpus=5.0, held_gpus=5.0)  # 50% of the GPUs: its dominant share
    cpu_heavy = TenantState("c", held_cpus=40.0)  # 40% of the CPUs
    out = run([job("g1", "g", cpus=1.0, gpus=1.0), job("c1", "c")], Resources(50.0, 5.0), [gpu_heavy, cpu_heavy],
              total=total)
    assert ids(out.admit) == ["c1", "g1"]


def test_priority_then_age_within_a_tenant_but_never_across_tenants():
    jobs = [job("old", "a", age=30), job("urgent", "a", priority=9, age=1), job("new", "a", age=2),
            job("b-urgent", "b", priority=99, age=0.5)]
    out = run(jobs, Resources(2.0), [TenantState("a"), TenantState("b", held_cpus=1.0)], total=Resources(3.0))
    assert ids(out.admit) == ["urgent", "old"]  # b's priority 99 does not jump a tenant holding less


def test_a_job_that_fits_starts_ahead_of_a_head_that_does_not():
    jobs = [job("big", "a", age=10, workers=8), job("small", "a", age=5), job("other", "b", age=1)]
    out = run(jobs, Resources(2.0))
    assert ids(out.admit) == ["small", "other"]
    assert out.backfilled == {"small", "other"}
    assert out.head.job.id == "big" and out.head.cpus == pytest.approx(6.0)
    assert out.reservation is None  # it has waited 10 s of 300


def test_after_reserve_after_s_capacity_is_held_for_the_head():
    jobs = [job("big", "a", age=301, workers=8), job("small", "a", age=5), job("other", "b", age=1, workers=2)]
    out = run(jobs, Resources(2.0))
    assert out.reservation.job.id == "big" and out.reservation.waited_s == pytest.approx(301)
    assert out.admit == ()  # the 2 free CPUs are held for it: nothing behind it starts
    # only what is free beyond its demand may go to the jobs behind it
    out = run(jobs, Resources(9.0))
    assert ids(out.admit) == ["big", "small"]  # it fits now: it starts first, the rest share what is left
    out = run([job("big", "a", age=301, workers=8, gpus=8.0), job("cpu-only", "b", age=1)],
              Resources(cpus=20.0, gpus=4.0))
    assert out.reservation.job.id == "big" and ids(out.admit) == ["cpu-only"]  # 12 CPUs lie beyond its 8


def test_a_tenants_own_reserve_after_s_overrides_the_servers():
    jobs = [job("big", "a", age=20, workers=8), job("small", "b", age=1)]
    assert run(jobs, Resources(2.0), reserve_after_s=300).reservation is None
    out = run(jobs, Resources(2.0), [TenantState("a", reserve_after_s=10.0)])
    assert out.reservation.job.id == "big" and out.admit == ()
    out = run(jobs, Resources(2.0), [TenantState("a", reserve_after_s=600.0)], reserve_after_s=0)
    assert out.reservation is None and ids(out.admit) == ["small"]


def test_the_reservation_sticks_to_its_job_while_the_fair_order_moves():
    # b now holds less than a, so b's starving job comes first in fair order; the reservation stays a's
    jobs = [job("a-big", "a", age=400, workers=8), job("b-big", "b", age=500, workers=8)]
    tenants = [TenantState("a", held_cpus=4.0), TenantState("b")]
    out = run(jobs, Resources(6.0), tenants, total=Resources(10.0), reserved="a-big")
    assert out.reservation.job.id == "a-big" and out.admit == ()
    assert run(jobs, Resources(6.0), tenants, total=Resources(10.0)).reservation.job.id == "b-big"
    out = run(jobs, Resources(8.0), tenants, total=Resources(10.0), reserved="a-big")
    assert ids(out.admit) == ["a-big"] and out.reservation.job.id == "b-big"  # started; the next in turn


def test_a_tenant_held_back_by_its_quota_never_holds_back_another():
    capped = [job(f"a{i}", "a", age=10_000 - i) for i in range(1500)]  # its whole backlog is older
    jobs = capped + [job("b1", "b", age=1)]
    out = run(jobs, Resources(100.0), [TenantState("a", max_workers=2, held_workers=2)])
    assert ids(out.admit) == ["b1"]
    [blocked] = out.quota_blocked
    assert blocked.job.id == "a0" and blocked.workers == 1  # one look at its first job: it lacks 1 worker
    # within the quota its jobs start, in order, until the quota is reached
    out = run(jobs, Resources(100.0), [TenantState("a", max_workers=3, held_workers=1)])
    assert ids(out.admit) == ["b1", "a0", "a1"] or ids(out.admit) == ["a0", "b1", "a1"]
    assert len(out.quota_blocked) == 1 and out.quota_blocked[0].job.id == "a2"


def test_a_job_that_can_never_run_is_reported_not_waited_for():
    jobs = [job("huge", "a", age=10, workers=64), job("small", "b", age=1)]
    out = run(jobs, Resources(4.0), never=lambda j: "too big" if j.workers > 8 else None)
    assert out.never == ((jobs[0], "too big"),) and ids(out.admit) == ["small"] and out.head is None


def test_the_index_keeps_each_tenants_order_as_jobs_come_and_go():
    index = QueueIndex([job("a1", age=3), job("a2", age=2)])
    assert index.upsert(job("a0", priority=5, age=1))
    assert not index.upsert(job("a0", priority=5, age=1))  # known: nothing changes
    assert ids(index.queues()["a"]) == ["a0", "a1", "a2"]
    assert index.remove("a1") and not index.remove("a1")
    index.upsert(job("a2", age=2, waited=0))  # requeued: a new queued_at, the same place
    assert ids(index.queues()["a"]) == ["a0", "a2"] and index.get("a2").queued_at == NOW
    index.remove("a0")
    index.remove("a2")
    assert len(index) == 0 and "a" not in index.queues()


def test_a_full_cluster_costs_one_look_per_tenant_yet_finds_the_job_to_reserve_for():
    young = [job(f"a{i}", "a", age=20, workers=2) for i in range(50)]
    # b's job that waited long is last in b's queue (the others have a higher priority)
    starving = [job(f"b{i}", "b", priority=1, age=10, workers=2) for i in range(50)] + [
        job("b-old", "b", age=400, workers=2)]
    looked = []
    out = run(young + starving, Resources(1.0), never=lambda j: looked.append(j.id))
    assert out.reservation.job.id == "b-old" and out.head.job.id == "a0" and out.admit == ()
    if USE_BOUNDS:
        assert looked == ["a0", "b-old"]  # a's queue skipped after one look; b's walked to its starving job
    index = QueueIndex(young)
    assert index.bounds("a").oldest_queued_at == NOW - 20 and index.bounds("a").min_cpus == 2.0
    index.upsert(job("tiny", "a", age=500, cpus=0.5))
    assert (index.bounds("a").oldest_queued_at, index.bounds("a").min_cpus) == (NOW - 500, 0.5)
    index.remove("tiny")
    assert index.bounds("a").min_cpus == 2.0  # forgotten on a change, not left stale
