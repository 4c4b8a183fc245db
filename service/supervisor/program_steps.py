"""Joins a program's per-rank reports into one job-level record per step.

A program reports on every rank (as in Ray Train); the job's values are rank 0's, as the user's
own loop logs them, and each rank's time between reports is its entry for straggler scoring.
"""

from __future__ import annotations

from service.supervisor.aggregate import StepAggregator


class ProgramStepJoiner(StepAggregator):
    def __init__(self, world_size: int):
        super().__init__(world_size, global_batch_size=0)

    def _join(self, ranks: list[dict]) -> dict:
        first = ranks[0]
        return {
            "step": first["step"], "loss": first["loss"], "step_time_s": max(r["step_time_s"] for r in ranks),
            "samples_per_s": first.get("samples_per_s"), "tokens_per_s": first.get("tokens_per_s"),
            "grad_norm": first.get("grad_norm"), "lr": first.get("lr"), "comm_bytes": 0,
            "model_state_bytes": None, "bubble_fraction": None, "bubble_fraction_theoretical": None,
            "skipped": False, "skip_reason": None, "metrics": dict(first.get("metrics") or {}),
            "ts": max(r["ts"] for r in ranks),
            "ranks": [{"rank": r["rank"], "compute_time_s": r["compute_time_s"], "samples": r["samples"],
                       "comm_time_s": 0.0, "step_time_s": r["step_time_s"], "model_state_bytes": None,
                       "peak_memory_bytes": None} for r in ranks],
        }
