"""Pipeline bubble accounting: what the schedule should idle, and what each stage measurably did.

Theory is the fraction of a flush's wall time a stage idles on balanced stages
with free communication, for P ranks, M micro-batches per flush and V stages
per rank. Where a schedule splits the backward into input-gradient (B) and
weight-gradient (W) work, it assumes the zero-bubble paper's T_F = T_B = T_W:
  gpipe, 1f1b                    (P-1) / (M + P-1)
  interleaved_1f1b, looped_bfs   (P-1) / (V M + P-1)
  zero_bubble (ZB-H1, V chunks)  (P-1)(F+B-W) / (V M (F+B+W) + (P-1)(F+B-W)) = (P-1) / (3 V M + P-1)
  zbv_zero_bubble, dualpipe_v    (P-1)(F+B-2W) / (...) = 0
  chimera                        (P-2) / (2M + P-2)   (Li & Hoefler 2021, Table 2; F = B)
  pipedream, pipedream_2bw       (P-1) F / (M (F+B) + (P-1) F) = (P-1) / (3M + P-1) with B = 2F: no flush,
                                 but every step ends with the ranks agreeing on its loss (the trainer's
                                 skip and spike decisions), which drains (P-1) forwards' worth of the pipe

What each stage measurably did is taken by stage_meter.py on the ranks; this module holds
the theory and joins the ranks' reports, for the supervisor and the API (no torch here); the job
summary's pipeline section is summary.py.
"""

from __future__ import annotations


def theoretical_bubble(schedule: str, pp: int, microbatches: int, virtual_stages: int = 1) -> float:
    p, m, v = pp, microbatches, virtual_stages
    if p <= 1:
        return 0.0
    if schedule in ("gpipe", "1f1b"):
        return (p - 1) / (m + p - 1)
    if schedule in ("interleaved_1f1b", "looped_bfs"):
        return (p - 1) / (v * m + p - 1)
    if schedule == "zero_bubble":
        return (p - 1) / (3 * v * m + p - 1)
    if schedule in ("zbv_zero_bubble", "dualpipe_v"):
        return 0.0
    if schedule in ("pipedream", "pipedream_2bw"):
        return (p - 1) / (3 * m + p - 1)
    if schedule == "chimera":
        return (p - 2) / (2 * m + p - 2)
    raise ValueError(f"unknown pipeline schedule {schedule!r}")


def join_stage_reports(reports: list[dict]) -> tuple[list[dict], float | None, float | None]:
    """Per-rank stage reports of one step -> (per-stage means over data-parallel replicas,
    the pipeline's measured bubble (mean over stages), its theoretical bubble)."""
    by_stage: dict[int, list[dict]] = {}
    for r in reports:
        by_stage.setdefault(r["stage"], []).append(r)
    stages = []
    for stage in sorted(by_stage):
        group = by_stage[stage]
        joined = {k: sum(g[k] for g in group) / len(group) for k in group[0] if k != "stage"}
        joined["activation_bytes_peak"] = max(g["activation_bytes_peak"] for g in group)
        joined["activation_microbatches_peak"] = max(g["activation_microbatches_peak"] for g in group)
        stages.append({"stage": stage, **joined})
    if not stages:
        return [], None, None
    measured = sum(s["bubble_fraction"] for s in stages) / len(stages)
    return stages, measured, stages[0]["bubble_fraction_theoretical"]


def spec_theoretical_bubble(spec) -> float | None:
    """The ideal bubble of a spec's pipeline schedule; None when the spec has no pipeline."""
    from workers.spec import PipelineSpec, pipeline_microbatches

    p = spec.parallel
    if p.pp <= 1:
        return None
    pipe = p.pipeline or PipelineSpec()
    return theoretical_bubble(pipe.schedule, p.pp, pipeline_microbatches(spec), pipe.stages_per_rank)
