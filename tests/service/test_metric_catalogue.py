"""The catalogue and the mapping from drained supervisor records to metric updates."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from service.live_metrics import LiveMetrics
from service.metric_catalogue import (
    CATALOGUE,
    event_updates,
    exposed_names,
    mfu,
    step_updates,
)
from workers.events import (
    CheckpointEvent,
    PreemptedEvent,
    RebalanceEvent,
    ReplaceEvent,
    ResizeEvent,
    RestartCause,
    RestartEvent,
    StragglerAction,
    StragglerEvent,
    StragglerRecoveredEvent,
)

STEP = {
    "type": "step", "seq": 3, "step": 7, "loss": 2.5, "step_time_s": 0.2, "samples_per_s": 160.0,
    "tokens_per_s": 10240.0, "grad_norm": 1.5, "lr": 3e-3, "comm_bytes": 4096, "model_state_bytes": 1000,
    "bubble_fraction": 0.3, "bubble_fraction_theoretical": 0.2, "skipped": False, "ts": 1.0,
    "peak_memory_bytes_per_rank": [5_000_000, 6_000_000],
    "ranks": [{"rank": 0, "compute_time_s": 0.1, "comm_time_s": 0.05, "step_time_s": 0.2, "samples": 16,
               "straggler_score": 1.0, "model_state_bytes": 1000, "peak_memory_bytes": 5_000_000},
              {"rank": 1, "compute_time_s": 0.19, "comm_time_s": 0.01, "step_time_s": 0.2, "samples": 16,
               "straggler_score": 0.52, "model_state_bytes": 1000, "peak_memory_bytes": 6_000_000,
               "peak_memory_breakdown": {"params": 1000, "grads": 1000, "optimizer": 2000, "activations": 5_996_000}}],
    "stages": [{"stage": 0, "bubble_fraction": 0.25, "bubble_fraction_theoretical": 0.2, "busy_s": 0.1,
                "idle_s": 0.05, "activation_bytes_peak": 2048},
               {"stage": 1, "bubble_fraction": 0.35, "bubble_fraction_theoretical": 0.2, "busy_s": 0.1,
                "idle_s": 0.07, "activation_bytes_peak": 1024}],
}


def samples(live: LiveMetrics) -> dict[tuple, float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(live.registry).decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_catalogue_names_units_and_bounded_labels():
    names = [m.name for m in CATALOGUE]
    assert len(names) == len(set(names)), "one entry per metric"
    for m in CATALOGUE:
        assert m.name.startswith("trainyard_") and m.help, m
        assert "step" not in m.labels, f"{m.name}: never a label per step"
        assert set(m.labels) <= {"job", "name", "rank", "stage", "state", "cause", "reason", "action", "decision",
                                 "method", "route", "status", "stat", "quantile", "loop"}, m
        if m.kind == "histogram":
            assert m.name.endswith("_seconds") and m.buckets, m
    assert "trainyard_straggler_score" in exposed_names()
    assert "trainyard_restarts_total" in exposed_names()


def test_step_record_maps_to_job_rank_and_stage_series():
    live = LiveMetrics()
    live.drained("j1", [STEP], layout={"world_size": 2, "dp": 1, "tp": 1, "pp": 2},
                 spec={"supervisor": {"straggler": {"threshold": 0.6}}})
    got = samples(live)
    assert got[("trainyard_job_tokens_per_second", (("job", "j1"),))] == 10240.0
    assert got[("trainyard_job_grad_norm", (("job", "j1"),))] == 1.5
    assert got[("trainyard_job_world_size", (("job", "j1"),))] == 2
    assert got[("trainyard_job_step_seconds", (("job", "j1"), ("quantile", "0.5")))] == STEP["step_time_s"]
    # per-rank quantities as distributions across ranks, the slowest ranks by rank
    assert got[("trainyard_straggler_score", (("job", "j1"), ("stat", "min")))] == 0.52
    assert ("trainyard_straggler_score", (("job", "j1"), ("stat", "median"))) not in got  # only the lowest
    assert got[("trainyard_slowest_rank_straggler_score", (("job", "j1"), ("rank", "1")))] == 0.52
    assert got[("trainyard_straggler_threshold", (("job", "j1"),))] == 0.6
    assert got[("trainyard_rank_peak_memory_bytes", (("job", "j1"), ("stat", "max")))] == 6_000_000
    assert got[("trainyard_rank_compute_seconds", (("job", "j1"), ("stat", "max")))] == 0.19
    assert not any(dict(labels).get("rank") and not name.startswith("trainyard_slowest_rank_")
                   for name, labels in got), "only the slowest ranks carry a rank label"
    assert got[("trainyard_stage_bubble_fraction", (("job", "j1"), ("stage", "1")))] == 0.35
    assert got[("trainyard_stage_bubble_fraction_theoretical", (("job", "j1"), ("stage", "0")))] == 0.2
    assert got[("trainyard_stage_activation_bytes_in_flight", (("job", "j1"), ("stage", "0")))] == 2048
    assert not any(n == "trainyard_job_mfu_ratio" for n, _ in got), "no MFU without a known hardware peak"


def test_an_moe_step_sets_the_expert_load_imbalance():
    updates = step_updates("j", {**STEP, "expert_tokens": [30, 10, 20, 20], "expert_load_imbalance": 1.5})
    assert [u.value for u in updates if u.name == "trainyard_job_expert_load_imbalance"] == [1.5]
    assert not [u for u in step_updates("j", STEP) if u.name == "trainyard_job_expert_load_imbalance"]


def test_a_parameter_server_step_sets_its_staleness_and_rows():
    updates = step_updates("j", {**STEP, "ps_staleness": 2, "ps_rows": 680})
    assert [u.value for u in updates if u.name == "trainyard_job_ps_staleness"] == [2]
    assert [u.value for u in updates if u.name == "trainyard_job_ps_rows"] == [680]
    assert not [u for u in step_updates("j", STEP) if u.name.startswith("trainyard_job_ps_")]


def test_non_finite_values_and_skipped_steps():
    updates = step_updates("j", {**STEP, "grad_norm": float("nan"), "skipped": True, "ranks": [], "stages": []})
    names = {u.name for u in updates}
    assert "trainyard_job_grad_norm" not in names
    assert "trainyard_skipped_steps" in names


def test_events_map_to_bounded_counters():
    """Labels come from the typed events' fields (cause, decision, layouts), not from their sentences."""
    def one(event):
        return [(u.name, dict(u.labels)) for u in event_updates("j", event)]

    def restart(cause):
        return RestartEvent(1, 0, "rank 0 failed", cause, "rank 0 failed; restart 1/3")

    def straggler(decision, action):
        return StragglerEvent(1, 0.3, 20, "rebalance", decision, action)

    assert one(restart(RestartCause.WORKER_LOST)) == [("trainyard_restarts", {"job": "j", "cause": "worker_lost"})]
    assert ("trainyard_rollbacks", {"job": "j", "cause": "non_finite"}) in one(restart(RestartCause.NON_FINITE))
    assert one(ResizeEvent({"world_size": 4}, {"world_size": 2}, "only 2 worker slots")) == [
        ("trainyard_resizes", {"job": "j", "reason": "shrink"})]
    assert one(ResizeEvent({"world_size": 2}, {"world_size": 4}, "room"))[0][1]["reason"] == "grow"
    assert one(straggler(StragglerAction.REBALANCE_PLANNED, "rebalancing the global batch from [16, 16] to [24, 8] "
                         "at the next agreement step")) == [
        ("trainyard_straggler_actions", {"job": "j", "action": "rebalance_planned"})]
    # The sentence does not decide the label: a "reported" decision stays reported whatever it says.
    assert one(straggler(StragglerAction.REPORTED, "rebalancing? no: the split [9, 7] already follows the "
                         "measured speed"))[0][1]["action"] == "reported"
    assert one(StragglerRecoveredEvent(1, 0.9, 30))[0][1]["action"] == "recovered"
    assert one(RebalanceEvent((10, 6), (8, 8), 20))[0][1]["action"] == "rebalanced"
    assert one(straggler(StragglerAction.REPLACE_PLANNED, "replacing rank 1 off node 0a1b2c3d4e5f at the next "
                         "checkpoint"))[0][1]["action"] == "replace_planned"
    assert one(ReplaceEvent(1, "a", "b", 20, ("b", "c"), ("a",)))[0][1]["action"] == "replaced"
    names = [n for n, _ in one(CheckpointEvent(50, 1.2, bytes=123))]
    assert names == ["trainyard_checkpoints", "trainyard_job_last_checkpoint_step",
                     "trainyard_checkpoint_seconds", "trainyard_checkpoint_bytes"]
    assert one(PreemptedEvent("high", 12, 10)) == []


def test_finished_jobs_series_are_dropped_after_the_retention():
    live = LiveMetrics(retention_s=60.0)
    restart = RestartEvent(1, 0, "rank 0 hung", RestartCause.HANG, "hang")
    live.drained("old", [STEP, {"type": "event", "seq": 4, "kind": "restart", "event": restart}])
    live.drained("new", [STEP])
    assert live.retain({"old", "new"}, now=0.0) == []
    assert live.retain({"new"}, now=10.0) == []  # "old" ended: its counters are kept for the retention
    assert {name for name, labels in samples(live) if dict(labels).get("job") == "old"} == {
        "trainyard_restarts_total"}
    assert live.retain({"new"}, now=71.0) == ["old"]
    assert not any(dict(labels).get("job") == "old" for _, labels in samples(live))
    assert any(dict(labels).get("job") == "new" for _, labels in samples(live))


def test_mfu_only_with_a_known_peak_and_model_size():
    params = 1_000_000
    assert mfu(1000.0, params, 0.0, 2) is None
    assert mfu(1000.0, params, 1e12, 2) == 6 * params * 1000.0 / 2e12
    live = LiveMetrics(peak_flops_per_worker=1e12)
    live.drained("j", [{**STEP, "model_params": params}], layout={"world_size": 2}, spec={"model": {"name": "gpt"}})
    assert ("trainyard_job_mfu_ratio", (("job", "j"),)) in samples(live)
    unsized = LiveMetrics(peak_flops_per_worker=1e12)  # a program's own loop: no parameter count, no MFU
    unsized.drained("j", [STEP], layout={"world_size": 2}, spec={"program": {"command": ["true"]}})
    assert ("trainyard_job_mfu_ratio", (("job", "j"),)) not in samples(unsized)


def test_mfu_from_the_peak_the_workers_looked_up_and_the_setting_overrides_it():
    spec, layout, params = {"model": {"name": "gpt"}}, {"world_size": 2}, 123_456
    looked_up = LiveMetrics()  # no setting: the GPU workers' table figure (workers/peak_flops.py)
    looked_up.drained("j", [{**STEP, "model_params": params, "peak_flops_per_s": 989.4e12}], layout=layout, spec=spec)
    got = samples(looked_up)[("trainyard_job_mfu_ratio", (("job", "j"),))]
    assert got == pytest.approx(6 * params * STEP["tokens_per_s"] / (2 * 989.4e12))
    overridden = LiveMetrics(peak_flops_per_worker=1e12)
    overridden.drained("j", [{**STEP, "model_params": params, "peak_flops_per_s": 989.4e12}], layout=layout, spec=spec)
    assert samples(overridden)[("trainyard_job_mfu_ratio", (("job", "j"),))] == pytest.approx(
        6 * params * STEP["tokens_per_s"] / 2e12)
    cpu = LiveMetrics()  # CPU workers report no peak: no series, and the panel says why (deploy/dashboards.py)
    cpu.drained("j", [{**STEP, "model_params": params, "peak_flops_per_s": None}], layout=layout, spec=spec)
    assert ("trainyard_job_mfu_ratio", (("job", "j"),)) not in samples(cpu)


def test_an_asynchronous_pipeline_step_sets_its_staleness():
    updates = step_updates("j", {**STEP, "pipeline_staleness": 0.25})
    assert [u.value for u in updates if u.name == "trainyard_job_pipeline_staleness"] == [0.25]
    assert not [u for u in step_updates("j", STEP) if u.name == "trainyard_job_pipeline_staleness"]
