"""The job summary's pipeline section (service/supervisor/summary.py): the split with its costs,
and bubble and activations per stage over the run's steady steps. Torch-free: the costs come
from a child process in a supervisor (unit_costs_apart.py)."""

from __future__ import annotations

from workers.parallel.pipeline.bubble import spec_theoretical_bubble
from workers.parallel.pipeline.stage_plan import plans_from_costs, stage_to_rank
from workers.parallel.pipeline.unit_costs_apart import unit_costs_apart
from workers.spec import V_SCHEDULES, JobSpec, PipelineSpec, pipeline_microbatches


def pipeline_summary(spec: JobSpec, steps: list[dict]) -> dict | None:
    """The job summary's pipeline section: schedule, split with costs, bubble and activations per stage,
    averaged over `steps` (the steady-state job-level step records). None for non-pipeline jobs."""
    p = spec.parallel
    if p.pp <= 1:
        return None
    pipe = p.pipeline or PipelineSpec()
    v, m = pipe.stages_per_rank, pipeline_microbatches(spec)
    plans = plans_from_costs(unit_costs_apart(spec), p.pp * v, pipe.split)
    total_cost = sum(pl.cost for pl in plans) or 1.0
    split = [{**pl.to_dict(), "rank": stage_to_rank(pl.stage, p.pp, pipe.schedule in V_SCHEDULES),
              "cost_share": pl.cost / total_cost} for pl in plans]
    measured = [s["bubble_fraction"] for s in steps if s.get("bubble_fraction") is not None]
    per_stage: dict[int, list[dict]] = {}
    for s in steps:
        for st in s.get("stages", []):
            per_stage.setdefault(st["stage"], []).append(st)
    stages = [{
        "stage": k,
        **{f: sum(x[f] for x in v_) / len(v_) for f in ("busy_s", "forward_s", "backward_s", "weight_grad_s",
                                                        "comm_s", "idle_s", "other_s", "wall_s",
                                                        "bubble_fraction")},
        "bubble_fraction_theoretical": v_[0]["bubble_fraction_theoretical"],
        "activation_bytes_peak": max(x["activation_bytes_peak"] for x in v_),
        "activation_microbatches_peak": max(x["activation_microbatches_peak"] for x in v_),
    } for k, v_ in sorted(per_stage.items())]
    return {
        "schedule": pipe.schedule, "microbatches": m, "virtual_stages": v,
        "flushes_per_step": max(1, spec.grad_accum_steps // m), "split": split,
        "bubble_fraction": sum(measured) / len(measured) if measured else None,
        "bubble_fraction_theoretical": spec_theoretical_bubble(spec),
        "stages": stages,
    }
