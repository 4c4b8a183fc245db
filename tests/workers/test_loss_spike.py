"""Loss spikes and rollbacks: skip the update, past a threshold roll back, skip the data window, lower the LR."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch.distributed.checkpoint as dcp

from service.supervisor.run import JobRun
from tests.api.test_cli_run import json_summary, trainyard, write_spec
from tests.helpers import Events, spec_of, tiny_spec
from workers.checkpointing import latest_checkpoint
from workers.data.batches import GlobalBatches
from workers.spec import SPEC_ERRORS, LossSpikeSpec, format_validation_error
from workers.training.lr_schedule import lr_at
from workers.training.recovery import LossSpikeDetector

BASE = {"resources.workers": 2, "train.steps": 24, "checkpoint.every_steps": 5,
        "fault_tolerance.loss_spike": {"factor": 3.0, "window": 4}}


def test_skipped_windows_shift_later_steps_to_the_next_batches():
    batches = GlobalBatches(list(range(100)), 4, seed=0)
    before = [batches.indices(s, 0, 4) for s in range(8)]
    batches.skip_window(2, 4)
    assert [batches.batch_of(s) for s in range(6)] == [0, 1, 4, 5, 6, 7]
    assert batches.indices(2, 0, 4) == before[4]  # step 2 draws what step 4 drew before
    batches.skip_window(3, 6)  # overlapping windows merge
    assert batches.skip == [(2, 6)] and batches.batch_of(2) == 6
    assert GlobalBatches(list(range(100)), 4, 0, [(2, 6)]).indices(2, 0, 4) == batches.indices(2, 0, 4)


def test_a_spike_is_a_loss_above_factor_times_the_running_median():
    detector = LossSpikeDetector(LossSpikeSpec(factor=3.0, window=4))
    assert not detector.is_spike(100.0)  # no verdict before the window is full
    for loss in (5.0, 4.0, 3.0, 2.5):
        detector.observe(loss)
    assert detector.is_spike(10.6) and not detector.is_spike(10.4)  # median 3.5
    detector.observe(float("nan"))  # never part of the baseline
    assert list(detector.history) == [5.0, 4.0, 3.0, 2.5]
    assert not LossSpikeDetector(None).is_spike(1e9)


def run(tmp_path, name, faults=(), **overrides):
    rec = Events()
    summary = JobRun(spec_of(**{**BASE, **overrides}, fault_injection=list(faults)), tmp_path / name, name, rec).run()
    return summary, rec


def recorded_progress(job_dir: Path) -> dict:
    state = {"progress": {"step": None, "data_skips": None, "lr_scale": None}}
    dcp.load(state, checkpoint_id=str(latest_checkpoint(job_dir)[1]), no_dist=True)
    return state["progress"]


@pytest.mark.slow
def test_a_clean_run_has_no_spikes_and_one_spike_is_skipped(ray_cluster, tmp_path):
    clean, rec = run(tmp_path, "clean")
    assert clean["state"] == "SUCCEEDED" and not [d for k, d in rec.events if k == "skipped_step"]

    summary, rec = run(tmp_path, "spike", [{"at_step": 12, "rank": 1, "kind": "spike", "factor": 50.0}])
    assert summary["state"] == "SUCCEEDED" and summary["restarts"] == 0
    assert [(d["step"], d["reason"]) for k, d in rec.events if k == "skipped_step"] == [(12, "loss_spike")]
    spiked = next(s for s in rec.steps if s["step"] == 12)
    assert spiked["skipped"] and spiked["loss"] > 3.0 * clean["initial_loss"]
    assert summary["params_sha256"] != clean["params_sha256"]  # one update fewer
    assert math.isfinite(summary["final_loss"]) and summary["final_loss"] < summary["initial_loss"]


@pytest.mark.slow
def test_repeated_spikes_roll_back_skip_their_data_and_lower_the_lr(ray_cluster, tmp_path):
    summary, rec = run(tmp_path, "rollback", [{"at_step": 12, "rank": 0, "kind": "spike", "factor": 50.0, "steps": 2}],
                       **{"fault_tolerance.max_skipped_steps": 1, "fault_tolerance.lr_backoff": 0.5})
    assert summary["state"] == "SUCCEEDED" and summary["restarts"] == 1 and summary["rollbacks"] == 1
    assert [(d["step"], d["reason"]) for k, d in rec.events if k == "skipped_step"][:1] == [(12, "loss_spike")]
    [restart] = [d for k, d in rec.events if k == "restart"]
    assert restart["cause"] == "non_finite" and restart["resume_step"] == 10
    [rollback] = [d for k, d in rec.events if k == "rollback"]
    # Steps 12 and 13 drew batches 11 and 12 (step k draws batch k - 1): those are never drawn again.
    assert rollback == {"from_step": 13, "to_step": 10, "skipped_steps": [12, 13], "reason": "loss_spike",
                        "data_window": [11, 13], "lr_scale": 0.5, "rollback": 1}
    spec = spec_of(**BASE)
    lrs = {s["step"]: s["lr"] for s in rec.steps}
    assert lrs[10] == pytest.approx(lr_at(spec.train, 9))  # before the rollback: the schedule's own
    assert all(lrs[s] == pytest.approx(0.5 * lr_at(spec.train, s - 1)) for s in range(11, 25))
    assert math.isfinite(summary["final_loss"]) and summary["final_loss"] < summary["initial_loss"]
    # The checkpoints written after the rollback record the skipped window and the LR factor.
    progress = recorded_progress(tmp_path / "rollback")
    assert progress == {"step": 24, "data_skips": [[11, 13]], "lr_scale": 0.5}


@pytest.mark.exhaustive  # make test: the same rollback on a Ray cluster (the tests above)
@pytest.mark.slow
def test_run_json_rolls_back_an_injected_nan_and_skips_its_data(tmp_path, ray_address):
    spec = tiny_spec(**{"resources.workers": 2, "train.steps": 16, "checkpoint.every_steps": 5,
                        "fault_tolerance.max_skipped_steps": 0, "fault_tolerance.lr_backoff": 0.5})
    spec["fault_injection"] = [{"at_step": 8, "rank": 1, "kind": "nan"}]
    summary = json_summary(trainyard(tmp_path, "run", write_spec(tmp_path, "nan", spec), "--json", allow_faults=True,
                                     ray_address=ray_address))
    assert summary["state"] == "SUCCEEDED" and summary["restarts"] == 1 and summary["rollbacks"] == 1
    assert summary["lr_scale"] == 0.5 and summary["steps"] == 16
    assert math.isfinite(summary["final_loss"]) and summary["final_loss"] < summary["initial_loss"]
    ledger = json.loads((Path(summary["job_dir"]) / "recovery.json").read_text())
    assert ledger["data_skips"] == [[7, 8]] and ledger["rollbacks"][0]["bad_steps"] == [8, 8]
    assert ledger["rollbacks"][0]["reason"] == "non_finite"


@pytest.mark.parametrize("overrides,faults,field,rule", [
    ({"fault_tolerance.loss_spike": {"factor": 1.0}}, [], "fault_tolerance.loss_spike.factor", "greater than 1"),
    ({"fault_tolerance.lr_backoff": 1.5}, [], "fault_tolerance.lr_backoff", "less than or equal to 1"),
    ({}, [{"at_step": 19, "kind": "spike", "steps": 3}], "fault_injection[0].steps", "must end by train.steps"),
    ({}, [{"at_step": 2, "kind": "crash", "steps": 2}], "fault_injection[0].steps", "kinds 'nan' and 'spike' only"),
])
def test_bad_numerics_settings_are_refused_naming_the_field(overrides, faults, field, rule):
    with pytest.raises(SPEC_ERRORS) as exc:
        spec_of(**overrides, fault_injection=faults)
    [error] = format_validation_error(exc.value)
    assert error["field"] == field and rule in error["message"]
