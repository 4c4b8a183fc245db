"""A job's Prometheus series do not grow with its ranks: per-rank quantities are exported as their
distribution across ranks (`stat` = min | median | max, the stats each quantity needs) plus the slowest
ranks (at most 8) by `rank`, re-chosen every step; every rank's own numbers stay in the REST API. A running
job stays within its series budget, and a job that ended keeps only its final counters, for the retention."""

from __future__ import annotations

import random

import pytest
from fastapi.testclient import TestClient
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from service.live_metrics import LiveMetrics
from service.metric_catalogue import (
    RANK_QUANTITIES,
    RUNNING_JOB_SERIES_BUDGET,
    SLOWEST_FAMILIES,
    SLOWEST_RANKS,
    distribution,
    slowest_ranks,
    update,
)
from service.metrics import job_families
from service.supervisor.record_buffer import RecordBuffer

SPEC = {"supervisor": {"straggler": {"policy": "report", "threshold": 0.6}}}


def step(n: int, world: int, slow: dict[int, float] | None = None, scored: bool = True,
         measured: bool = True) -> dict:
    """A joined step record (service/supervisor/aggregate.py's shape) of `world` ranks; `slow` maps a rank to
    how many times slower than the others it computes."""
    slow = slow or {}
    ranks = []
    for r in range(world):
        compute = 0.1 * slow.get(r, 1.0) + 1e-4 * r  # distinct: a deterministic order among equals
        entry = {"rank": r, "compute_time_s": compute, "comm_time_s": 0.02, "step_time_s": 0.1 * max(slow.values(),
                 default=1.0) + 0.02, "samples": 4, "model_state_bytes": 1000,
                 "peak_memory_bytes": 5000 + r if measured else None,
                 "peak_memory_breakdown": {"params": 1000, "grads": 1000, "optimizer": 2000,
                                           "activations": 1000 + r} if measured else None}
        if scored:
            entry["straggler_score"] = 1.0 / slow.get(r, 1.0)
        ranks.append(entry)
    return {"type": "step", "seq": n, "step": n, "loss": 2.0, "step_time_s": ranks[0]["step_time_s"],
            "samples_per_s": 100.0, "tokens_per_s": 1000.0, "grad_norm": 1.0, "lr": 1e-3, "comm_bytes": 10,
            "skipped": False, "ts": float(n), "ranks": ranks,
            **({"peak_memory_bytes_per_rank": [r["peak_memory_bytes"] for r in ranks]} if measured else {})}


def series(live: LiveMetrics, job: str) -> list[tuple[str, dict[str, str]]]:
    out = []
    for family in text_string_to_metric_families(generate_latest(live.registry).decode()):
        for s in family.samples:
            if s.labels.get("job") == job:
                out.append((s.name, dict(s.labels)))
    return out


def shape(live: LiveMetrics, job: str) -> set[tuple[str, tuple]]:
    """The job's series as names and label sets, the rank (and job) label's value left out."""
    return {(name, tuple(sorted((k, "*" if k in ("rank", "job") else v) for k, v in labels.items())))
            for name, labels in series(live, job)}


def drain(live: LiveMetrics, job: str, world: int, records: list[dict]) -> None:
    live.drained(job, records, layout={"world_size": world, "dp": world, "tp": 1, "pp": 1}, spec=SPEC)


def slowest(live: LiveMetrics, job: str, family: str = "trainyard_slowest_rank_straggler_score") -> set[int]:
    return {int(labels["rank"]) for name, labels in series(live, job) if name == family}


def test_the_series_of_a_job_are_the_same_for_2_and_8_ranks():
    live = LiveMetrics()
    for n in range(1, 4):  # the same steps: rank 1 computes 3x slower in both jobs
        drain(live, "two", 2, [step(n, 2, {1: 3.0})])
        drain(live, "eight", 8, [step(n, 8, {1: 3.0})])
    assert shape(live, "two") == shape(live, "eight")
    assert len(series(live, "eight")) - len(series(live, "two")) == 8 - 2  # only the slowest ranks differ
    names = {name for name, _ in series(live, "two")}
    for _, name, want in RANK_QUANTITIES:
        stats = {labels["stat"] for n, labels in series(live, "eight") if n == name}
        assert stats == set(want) and name in names, name


def db_series(jobs: int, finished: int = 0) -> int:
    """The database part's series (service/metrics.py) of `jobs` open and `finished` finished jobs."""
    from types import SimpleNamespace

    def row(i: int, state: str):
        return SimpleNamespace(id=f"j{i}", name="n", state=state, step=10, total_steps=100, loss=2.0,
                               samples_per_s=50.0, restarts=0, summary=None)

    families = job_families([row(i, "RUNNING") for i in range(jobs)],
                            [row(i, "SUCCEEDED") for i in range(jobs, jobs + finished)])
    return sum(len(f.samples) for f in families)


@pytest.mark.parametrize("world", [2, 8, 4096])
def test_a_running_job_stays_within_its_series_budget_whatever_its_ranks(world):
    """Everything a running job can carry but per-stage and per-event series: scored ranks, a measured
    memory peak, a checkpoint (with its size) and MFU."""
    live = LiveMetrics(peak_flops_per_worker=1e12)
    records = [{**step(n, world, {1: 3.0}), "model_params": 1e6} for n in range(1, 4)]
    drain(live, "j", world, records)
    live.apply([update("trainyard_checkpoints", "inc", 1, job="j"),
                update("trainyard_job_last_checkpoint_step", "set", 3, job="j"),
                update("trainyard_checkpoint_seconds", "set", 1.5, job="j"),
                update("trainyard_checkpoint_bytes", "set", 1e6, job="j")])
    total = len(series(live, "j")) + db_series(1)
    assert total <= RUNNING_JOB_SERIES_BUDGET, (total, sorted({n for n, _ in series(live, "j")}))
    assert db_series(1) == 7 and db_series(0, finished=1) == 4  # a finished job: state, step, loss, restarts


def test_a_64_rank_job_has_at_most_8_series_by_rank_per_metric_and_as_many_series_as_a_4096_rank_one():
    live = LiveMetrics()
    drain(live, "j64", 64, [step(1, 64, {5: 2.0, 40: 3.0})])
    drain(live, "j4096", 4096, [step(1, 4096, {5: 2.0, 4000: 3.0})])
    by_metric: dict[str, int] = {}
    for name, labels in series(live, "j64"):
        if "rank" in labels:
            by_metric[name] = by_metric.get(name, 0) + 1
    assert set(by_metric) == set(SLOWEST_FAMILIES)
    assert all(n == SLOWEST_RANKS == 8 for n in by_metric.values()), by_metric
    assert len(series(live, "j4096")) == len(series(live, "j64"))
    assert shape(live, "j4096") == shape(live, "j64")
    # the slowest lead, and the distributions are those of all the ranks
    assert {5, 40} <= slowest(live, "j64")
    got = {(n, labels.get("stat")): v for n, labels, v in
           ((s.name, s.labels, s.value) for f in text_string_to_metric_families(generate_latest(live.registry)
                                                                                 .decode()) for s in f.samples)
           if labels.get("job") == "j4096"}
    assert got[("trainyard_straggler_score", "min")] == pytest.approx(1 / 3)
    assert got[("trainyard_rank_compute_seconds", "max")] == pytest.approx(0.3 + 1e-4 * 4000)
    assert got[("trainyard_rank_peak_memory_bytes", "max")] == 5000 + 4095


def test_the_slowest_ranks_follow_the_slow_ranks_and_those_that_leave_lose_their_series():
    live = LiveMetrics()
    first = dict.fromkeys(range(0, 8), 2.0)
    drain(live, "j", 64, [step(1, 64, first)])
    for family in SLOWEST_FAMILIES:
        assert slowest(live, "j", family) == set(range(8))
    later = dict.fromkeys(range(50, 58), 2.5)
    drain(live, "j", 64, [step(2, 64, later)])
    for family in SLOWEST_FAMILIES:
        assert slowest(live, "j", family) == set(range(50, 58)), family  # ranks 0-7 left: their series are gone
    # one rank slow: it leads; the other seven are the next slowest by compute among equal scores
    drain(live, "j", 64, [step(3, 64, {33: 4.0})])
    scores = {int(labels["rank"]): v for n, labels, v in
              ((s.name, s.labels, s.value) for f in text_string_to_metric_families(generate_latest(live.registry)
                                                                                   .decode()) for s in f.samples)
              if n == "trainyard_slowest_rank_straggler_score"}
    assert len(scores) == 8 and scores[33] == 0.25 and min(scores, key=scores.__getitem__) == 33
    # a smaller world after a resize: the ranks that are gone lose their series
    drain(live, "j", 4, [step(4, 4, {2: 2.0})])
    assert slowest(live, "j") == {0, 1, 2, 3}
    # a drain of several steps: the last step's ranks decide
    drain(live, "j", 64, [step(5, 64, {3: 2.0}), step(6, 64, {61: 2.0})])
    assert 61 in slowest(live, "j") and 3 not in slowest(live, "j")


def test_without_scores_the_score_series_by_rank_go():
    live = LiveMetrics()
    drain(live, "j", 16, [step(1, 16, {3: 2.0})])
    assert len(slowest(live, "j", "trainyard_slowest_rank_straggler_score")) == 8
    drain(live, "j", 16, [step(2, 16, {9: 2.0}, scored=False)])  # e.g. the policy judges afresh after a resize
    assert slowest(live, "j", "trainyard_slowest_rank_straggler_score") == set()
    assert not [labels for _, labels in series(live, "j") if "rank" in labels]


def test_an_unmeasured_step_keeps_the_last_measured_memory():
    live = LiveMetrics()
    drain(live, "j", 8, [step(1, 8)])
    drain(live, "j", 8, [step(2, 8, measured=False)])  # CPU workers measure memory on a schedule
    got = {(n, labels.get("stat"), labels.get("category")) for n, labels in series(live, "j")}
    assert ("trainyard_rank_peak_memory_bytes", "max", None) in got


def test_a_measured_step_drained_late_still_sets_the_memory_peak():
    """CPU workers measure steps 1-3; a control plane that drains after step 4 gets those steps without
    their rank entries (only the newest keeps them, record_buffer.py): their peak must still be exported."""
    buffer = RecordBuffer()
    for n in range(1, 5):
        buffer.push(step(n, 8, measured=n <= 3))
    records = buffer.drain(0)
    assert [bool(r.get("ranks")) for r in records] == [False, False, False, True]
    live = LiveMetrics()
    drain(live, "j", 8, records)
    got = {(s.name, s.labels.get("stat")): s.value for f in text_string_to_metric_families(
        generate_latest(live.registry).decode()) for s in f.samples if s.labels.get("job") == "j"}
    assert got[("trainyard_rank_peak_memory_bytes", "max")] == 5000 + 7


def test_a_job_that_ended_keeps_only_its_counters_until_the_retention_and_then_nothing():
    live = LiveMetrics(retention_s=60.0)
    drain(live, "old", 64, [step(1, 64, {7: 2.0})])
    live.apply([update("trainyard_restarts", "inc", 1, job="old", cause="hang")])
    drain(live, "quiet", 2, [step(1, 2)])  # no event counter: nothing to keep once it ends
    drain(live, "new", 2, [step(1, 2)])
    running = len(series(live, "old"))
    assert live.retain({"old", "quiet", "new"}, now=0.0) == []
    assert live.retain({"new"}, now=1.0) == ["quiet"]
    assert [n for n, _ in series(live, "old")] == ["trainyard_restarts_total"] and running > 20
    assert series(live, "quiet") == []
    assert live.retain({"new"}, now=30.0) == []
    assert live.retain({"new"}, now=61.0) == ["old"]
    assert series(live, "old") == [] and series(live, "new")
    drain(live, "old", 2, [step(1, 2)])  # the slowest ranks of the removed job do not linger in the bookkeeping
    assert slowest(live, "old") == {0, 1}


def test_no_created_samples_and_no_zero_counters_before_the_first_event():
    live = LiveMetrics()
    drain(live, "j", 2, [step(1, 2)])
    text = generate_latest(live.registry).decode()
    assert "_created" not in text and "_total{" not in text
    live.apply([update("trainyard_restarts", "inc", 1, job="j", cause="hang")])
    assert 'trainyard_restarts_total{cause="hang",job="j"} 1.0' in generate_latest(live.registry).decode()


def test_step_time_quantiles_over_the_recent_window():
    live = LiveMetrics()
    times = [0.1 * k for k in range(1, 101)]  # 0.1 .. 10.0 s, one per step
    random.Random(1).shuffle(times)
    drain(live, "j", 2, [{**step(n, 2), "step_time_s": t} for n, t in enumerate(times[:60], start=1)])
    drain(live, "j", 2, [{**step(n, 2), "step_time_s": t} for n, t in enumerate(times[60:], start=61)])
    got = {labels["quantile"]: v for n, labels, v in
           ((s.name, s.labels, s.value) for f in text_string_to_metric_families(generate_latest(live.registry)
                                                                                 .decode()) for s in f.samples)
           if n == "trainyard_job_step_seconds"}
    assert got == {"0.5": pytest.approx(5.0), "0.9": pytest.approx(9.0), "0.99": pytest.approx(9.9)}
    drain(live, "j", 2, [{**step(n, 2), "step_time_s": 0.05} for n in range(101, 201)])  # the window moves on
    text = generate_latest(live.registry).decode()
    assert 'trainyard_job_step_seconds{job="j",quantile="0.99"} 0.05' in text


def test_distribution_and_slowest_helpers():
    assert distribution([3.0, 1.0, 2.0]) == (1.0, 2.0, 3.0)
    assert distribution([4.0, 1.0, 2.0, 3.0]) == (1.0, 2.5, 4.0)
    ranks = [{"rank": r, "compute_time_s": c, "straggler_score": s} for r, c, s in
             ((0, 0.1, 1.0), (1, 0.3, 0.4), (2, 0.2, None), (3, 0.1, 0.9))]
    assert [r["rank"] for r in slowest_ranks(ranks, k=3)] == [1, 3, 0]  # scored: the lowest scores first
    random.Random(0).shuffle(ranks)
    assert [r["rank"] for r in slowest_ranks(ranks, k=3)] == [1, 3, 0]


def test_every_ranks_numbers_stay_in_the_rest_api_while_metrics_carry_at_most_8(tmp_path):
    """GET /v1/jobs/{id}/metrics keeps each rank's peak memory of the measured steps; /metrics has no series
    per rank beyond the slowest 8."""
    from api.http.app import create_app
    from service.control import ControlPlane
    from service.db import repository as repo
    from service.db import tenants as tenant_repo
    from service.db.engine import migrate
    from service.db.tenants import ADMIN_TENANT
    from service.settings import Settings
    from tests.helpers import spec_of
    from tests.live import ADMIN_TOKEN

    settings = Settings(home=tmp_path, admin_token=ADMIN_TOKEN)
    app = create_app(settings)
    plane = ControlPlane(settings)
    try:
        migrate(plane.engine)
        plane.bootstrap_admin()
        app.state.plane = plane
        records = [{**step(n, 64, {9: 2.0}), "peak_memory_bytes_per_rank": [5000 + r for r in range(64)]}
                   for n in (1, 2)]
        with plane.sessions.begin() as s:
            tenant = tenant_repo.ensure_tenant(s, ADMIN_TENANT).id  # the admin token's own tenant
            job = repo.create_job(s, tenant, spec_of(**{"train.steps": 2}), 0, "sha", None, max_open_jobs=10)
            repo.record_steps(s, job, records, max_points=1000)
            job_id = job.id
        plane.live.drained(job_id, records, layout={"world_size": 64, "dp": 64, "tp": 1, "pp": 1}, spec=SPEC)
        client = TestClient(app)  # no lifespan: the plane above, without loops
        auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        got = client.get(f"/v1/jobs/{job_id}/metrics", headers=auth)
        assert got.status_code == 200, got.text
        points = got.json()["points"]
        assert [p["peak_memory_bytes_per_rank"] for p in points] == [[5000 + r for r in range(64)]] * 2
        assert len(points[0]["peak_memory_breakdown_per_rank"]) == 64
        text = client.get("/metrics").text
        ranks = {line.split('rank="')[1].split('"')[0] for line in text.splitlines()
                 if job_id in line and 'rank="' in line}
        assert len(ranks) == 8 and "9" in ranks
    finally:
        plane.writes.close()
        plane.engine.dispose()
