"""Each rank's step and compute time of a step record, kept with the job's stored metric points for jobs
of up to MAX_RANKS_IN_POINTS ranks (the console's rank heatmap reads them over REST; larger jobs leave
them out, so a point never grows with a 4,096-rank job).

A step record carries its per-rank entries (`ranks`) only while it is the supervisor's newest
(record_buffer.py); an older one keeps just these two columns, as float32 arrays (about 1 KiB each at 256
ranks), so a buffer waiting for a late drain stays small.
"""

from __future__ import annotations

from array import array

MAX_RANKS_IN_POINTS = 256
FIELDS = {"rank_step_time_s": "step_time_s", "rank_compute_time_s": "compute_time_s"}


def compact_rank_times(ranks: list[dict]) -> dict[str, array]:
    """The columns a step record keeps once its per-rank entries are dropped (none past the rank limit)."""
    if not ranks or len(ranks) > MAX_RANKS_IN_POINTS:
        return {}
    return {key: array("f", (float(r.get(field) or 0.0) for r in ranks)) for key, field in FIELDS.items()}


def rank_times(record: dict) -> dict[str, list[float]]:
    """The two per-rank columns of a step record as JSON lists, from its per-rank entries or the compact
    columns; empty past the rank limit or when neither is there."""
    columns = compact_rank_times(record.get("ranks") or []) or {k: record[k] for k in FIELDS if record.get(k)}
    return {key: [round(v, 6) for v in values] for key, values in columns.items()}
