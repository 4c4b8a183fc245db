"""What the tracking sinks log, taken from what the supervisor already has: step records and the spec.

Metric names are the keys of `GET /v1/jobs/{id}/metrics` (a program's own keys too), so a series
reads the same in REST, MLflow and TensorBoard.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.metric_catalogue import mfu

# The step record's series worth charting (whatever of them a record carries).
STEP_METRICS = ("loss", "val_loss", "lr", "grad_norm", "samples_per_s", "tokens_per_s", "mfu", "step_time_s")
MAX_PARAM_VALUE = 6000  # MLflow's limit on a param's value
MAX_NAME = 250  # MLflow's limit on a param, metric or tag name
_NOT_IN_NAME = re.compile(r"[^\w\-. /]")  # MLflow names: alphanumerics, _ - . space /


@dataclass(frozen=True)
class StepMetrics:
    """One step's values, as every sink logs them."""

    step: int
    ts_ms: int
    values: dict[str, float]


@dataclass(frozen=True)
class RunTags:
    """Facts about the run that are no series: state, restarts, resizes."""

    tags: dict[str, str]


@dataclass(frozen=True)
class RunEnd:
    """The run is over: its final status and the files to keep with it."""

    status: str  # FINISHED | FAILED | KILLED (MLflow's run statuses)
    artifacts: tuple[Path, ...] = field(default_factory=tuple)


TrackingItem = StepMetrics | RunTags | RunEnd


def metric_name(key: str) -> str:
    return _NOT_IN_NAME.sub("_", key)[:MAX_NAME] or "_"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None  # a skipped step's NaN loss is an event, not a point


def step_metrics(record: dict[str, Any]) -> StepMetrics:
    """The chartable values of one job-level step record (a program's own reported keys included), and
    MFU where the model's size (the ranks count it) and every worker's peak FLOP/s are known (a GPU)."""
    values: dict[str, float] = {}
    for key, value in (record.get("metrics") or {}).items():  # a program's keys never shadow the columns
        if (number := _number(value)) is not None:
            values[metric_name(str(key))] = number
    for key in STEP_METRICS:
        if (number := _number(record.get(key))) is not None:
            values[key] = number
    if "mfu" not in values and record.get("peak_flops_per_s"):
        utilisation = mfu(record.get("tokens_per_s"), record.get("model_params"), record["peak_flops_per_s"],
                          len(record.get("ranks") or ()) or 1)
        if utilisation is not None:
            values["mfu"] = utilisation
    ts = record.get("ts")
    return StepMetrics(int(record["step"]), int(float(ts) * 1000) if ts is not None else 0, values)


def flat_params(tree: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """The resolved spec as flat `section.key` params; lists and empty sections as JSON text."""
    out: dict[str, str] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flat_params(value, f"{name}."))
        else:
            text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
            out[metric_name(name)] = text[:MAX_PARAM_VALUE]
    return out
