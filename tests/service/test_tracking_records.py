"""What the tracking sinks log: metric names as in REST, the spec as flat params, TensorBoard files
that EventAccumulator reads back (a restarted supervisor's replayed steps included)."""

from __future__ import annotations

import math

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from service.tracking.background import BackgroundLogger
from service.tracking.records import flat_params, step_metrics
from service.tracking.tensorboard_sink import TensorBoardSink


def test_step_metrics_take_the_rest_names_and_skip_what_is_no_finite_number():
    record = {"step": 7, "ts": 1700000000.25, "loss": 2.5, "lr": 1e-3, "grad_norm": None, "samples_per_s": 40.0,
              "tokens_per_s": 1280.0, "val_loss": 2.75, "step_time_s": 0.4, "comm_bytes": 10, "skipped": False}
    got = step_metrics(record)
    assert got.step == 7 and got.ts_ms == 1700000000250
    assert got.values == {"loss": 2.5, "lr": 1e-3, "samples_per_s": 40.0, "tokens_per_s": 1280.0, "val_loss": 2.75,
                          "step_time_s": 0.4}
    skipped = step_metrics({"step": 8, "ts": 1.0, "loss": math.nan, "lr": 1e-3})
    assert skipped.values == {"lr": 1e-3}


def test_mfu_is_logged_where_the_workers_peak_and_the_model_size_are_known():
    record = {"step": 5, "ts": 1.0, "tokens_per_s": 1000.0, "peak_flops_per_s": 1e12, "model_params": 10**6,
              "ranks": [{}, {}]}
    assert step_metrics(record).values["mfu"] == 6.0 * 1e6 * 1000.0 / (1e12 * 2)
    assert "mfu" not in step_metrics({**record, "model_params": None}).values  # a program: size not counted
    assert "mfu" not in step_metrics({**record, "peak_flops_per_s": None}).values  # CPU: unknown, not 0


def test_a_programs_own_keys_are_metrics_but_never_shadow_the_series():
    record = {"step": 3, "ts": 2.0, "loss": 1.5, "metrics": {"accuracy": 0.75, "loss": 99.0, "note": "text",
                                                              "top-1/err%": 0.2, "flag": True}}
    assert step_metrics(record).values == {"accuracy": 0.75, "loss": 1.5, "top-1/err_": 0.2}


def test_the_resolved_spec_becomes_flat_params():
    spec = {"name": "j", "train": {"steps": 10, "lr": 0.003}, "fault_injection": [{"at_step": 3}],
            "tracking": {"mlflow": {"tags": {}}, "tensorboard": True}, "program": None}
    assert flat_params(spec) == {"name": "j", "train.steps": "10", "train.lr": "0.003",
                                 "fault_injection": '[{"at_step": 3}]', "tracking.mlflow.tags": "{}",
                                 "tracking.tensorboard": "true", "program": "null"}


def test_tensorboard_files_read_back_with_event_accumulator_newest_value_per_step(tmp_path):
    for first, last, scale in ((1, 6, 1.0), (4, 8, 10.0)):  # a second supervisor replays steps 4..6
        logger = BackgroundLogger(TensorBoardSink(tmp_path), lambda e: None)
        for s in range(first, last + 1):
            logger.put(step_metrics({"step": s, "ts": 100.0 * scale + s, "loss": scale * s, "lr": 0.1}))
        logger.close(30)
        assert logger.dropped == 0
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert {"loss", "lr"} <= set(acc.Tags()["scalars"])
    newest = {}
    for event in acc.Scalars("loss"):
        newest[event.step] = event.value
    assert newest == {1: 1.0, 2: 2.0, 3: 3.0, 4: 40.0, 5: 50.0, 6: 60.0, 7: 70.0, 8: 80.0}
