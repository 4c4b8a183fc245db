"""The queueing policy's cost (service/queueing/): a pass reads each queued job at most once, takes well
under 100 ms over 10,000, and a look per tenant on a full cluster with the index's bounds."""

from __future__ import annotations

import time

import pytest

from service.queueing import QueuedJob, QueueIndex, Resources, TenantState, plan
from tests.service.test_queueing_policy import NOW, job

BIG = Resources(cpus=10_000.0, gpus=10_000.0)


def _backlog(n: int, tenants: int = 20) -> list[QueuedJob]:
    """n jobs of 1-8 GPUs, none waiting long enough (300 s) for a reservation: nothing stops a pass early."""
    return [job(f"j{i}", f"t{i % tenants}", priority=i % 3, age=(n - i) * 0.01, workers=1 + i % 8, gpus=1.0 + i % 8)
            for i in range(n)]


def _tick_s(jobs, free, bounds: bool = False) -> float:
    index = QueueIndex(jobs)
    tenants = {f"t{i}": TenantState(f"t{i}", weight=1 + i % 4) for i in range(20)}
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        plan(index.queues(), tenants, free, BIG, NOW, 300.0, bounds=index.bounds if bounds else None)
        best = min(best, time.perf_counter() - t0)
    return best


class CountingQueue(list):
    """A tenant's queue that counts how often the policy reads a job from it."""

    reads = 0

    def __getitem__(self, key):
        CountingQueue.reads += 1
        return super().__getitem__(key)


def _reads(n: int, free: Resources) -> int:
    index = QueueIndex(_backlog(n))
    queues = {tid: CountingQueue(q) for tid, q in index.queues().items()}
    CountingQueue.reads = 0
    plan(queues, {}, free, BIG, NOW, 300.0)
    return CountingQueue.reads


def test_a_pass_reads_each_queued_job_at_most_once():
    # Nothing fits, nobody has waited long enough to be reserved for: the worst case, every job read.
    for n in (5_000, 20_000):
        assert n <= _reads(n, Resources(cpus=0.5)) <= n + 40  # + a first look per tenant
    # Room for some: each admission sends its tenant back to the heap, no job is read twice.
    assert _reads(20_000, Resources(cpus=300.0, gpus=300.0)) <= 20_000 + 40


@pytest.mark.timing
def test_a_pass_over_ten_thousand_queued_jobs_is_fast_and_linear():
    # Worst case: nothing fits and nobody has waited long enough for a reservation, so every job is looked at.
    full = Resources(cpus=0.5, gpus=0.0)
    t5k, t10k, t20k = (_tick_s(_backlog(n), full) for n in (5_000, 10_000, 20_000))
    assert t10k < 0.1, f"{t10k * 1000:.1f} ms for 10,000 queued jobs"
    # four times the jobs: about 4x the time if linear, 16x if quadratic (test_a_pass_reads_each_queued_job_at_most_once
    # counts the reads exactly; this is the clock's view of it, with room for a busy host)
    assert t20k < 10 * t5k, f"four times the jobs took {t20k / t5k:.1f}x as long: not linear"
    # Room for 500 jobs out of 10,000: admissions cost a heap operation each.
    assert _tick_s(_backlog(10_000), Resources(cpus=2000.0, gpus=2000.0)) < 0.1
    # What the scheduler passes: with the index's bounds a full cluster costs a look per tenant.
    assert _tick_s(_backlog(10_000), full, bounds=True) < t10k / 10

