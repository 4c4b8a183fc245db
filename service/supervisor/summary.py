"""What a finished (or stopped) run reports: `trainyard run --json`, the job's stored summary."""

from __future__ import annotations

import statistics
from typing import Any

from service.supervisor.step_history import StepHistory
from workers.parallel.layouts import strategy_name
from workers.parallel.pipeline.summary import pipeline_summary
from workers.spec import JobSpec


def layout_of(spec: JobSpec) -> dict[str, Any]:
    p = spec.parallel
    if spec.program is not None:
        strategy = "program"
    else:
        strategy = strategy_name(spec)
    return {"dp": spec.dp, "tp": p.tp, "pp": p.pp, "cp": p.cp, "ep": p.ep, "zero": p.zero, "strategy": strategy,
            "world_size": spec.world_size}


def final_result(results: list[dict | None]) -> dict[str, Any]:
    """Rank 0's result of a finished group (the lead's, whose validation it has, where ranks trained alone
    and rank 0 may be lost), with the validation loss averaged over the ranks."""
    val = [r["val_loss"] for r in results if r is not None and r.get("val_loss") is not None]
    lead = next((r for r in results if r is not None and "lead" in r), results[0] if results else None)
    return {**(lead or {}), "val_loss": statistics.fmean(val) if val else None}


def _reported_mean(steps: list[dict], key: str) -> float | None:
    """A program's own figure (rank 0's reports), averaged over the steady steps."""
    values = [s[key] for s in steps if s.get(key) is not None]
    return statistics.fmean(values) if values else None


def steady_steps(steps: list[dict]) -> list[dict]:
    """The steps that throughput and bubble are taken over: not the first fifth (warm-up), and not
    the steps whose peak memory the CPU tracker measured (they run slower by its cost)."""
    steady = steps[len(steps) // 5:] or steps
    return [s for s in steady if not s.get("memory_tracked")] or steady


def compression_summary(kind: str, steps: list[dict]) -> dict[str, Any]:
    """parallel.compression: the median step's bytes against DDP's fp32 ring all-reduce of the same gradients
    (`ratio` = fp32 / sent: 2 for fp16, about 32 for onebit/signsgd on 2 ranks)."""
    pairs = [(s["comm_bytes"], s["comm_bytes_uncompressed"]) for s in steps
             if s.get("comm_bytes") and s.get("comm_bytes_uncompressed")]
    if not pairs:
        return {"kind": kind, "comm_bytes_fp32_per_step": None, "ratio": None}
    fp32 = statistics.median(u for _, u in pairs)
    sent = statistics.median(c for c, _ in pairs)
    return {"kind": kind, "comm_bytes_fp32_per_step": fp32, "ratio": fp32 / sent}


def run_summary(run: Any) -> dict[str, Any]:
    """The summary of a JobRun (service/supervisor/run.py) as it stands: last and first step exact, the
    steady-state figures over the run's step sample (service/supervisor/step_history.py)."""
    history: StepHistory = run.steps
    steps = list(history)
    spec: JobSpec = run.spec
    result: dict = run.result
    steady = steady_steps(steps)
    step_time = sum(s["step_time_s"] for s in steady)
    pipeline = pipeline_summary(run.current, steady)  # the split in use at the end
    g = spec.train.global_batch_size
    tokens = [s["tokens_per_s"] for s in steady if s.get("tokens_per_s")]
    summary = {
        "job_id": run.job_id,
        "name": spec.name,
        "state": str(run.state),
        "steps": history.last_step,
        "initial_loss": history.first.get("loss") if history.first else None,
        "final_loss": history.last["loss"] if history.last else None,
        "final_val_loss": result.get("val_loss"),
        # What the final validation covered (samples, batches per rank, their size, the split's size).
        "final_validation": result.get("validation"),
        "world_size": run.current.world_size - len(getattr(run, "lost_trainers", ())),
        "layout": layout_of(run.current),
        "samples_per_s": _reported_mean(steady, "samples_per_s") if spec.program is not None
        else g * len(steady) / step_time if step_time else None,
        # Steps joined from only some ranks (kept across a restart or resize) may lack the tokens.
        "tokens_per_s": statistics.fmean(tokens) if tokens else None,
        "bubble_fraction": pipeline["bubble_fraction"] if pipeline else None,
        "bubble_fraction_theoretical": pipeline["bubble_fraction_theoretical"] if pipeline else None,
        "pipeline": pipeline,  # schedule, split with costs, per-stage bubble and activations (pp > 1)
        "model_state_bytes_per_rank": result.get("model_state_bytes"),
        # Measured inside the steps (workers/step_memory.py): the high-water mark, max over measured steps.
        "peak_memory_bytes_per_rank": history.peak_memory_per_rank(run.current.world_size),
        "comm_bytes_per_step": statistics.median(comm) if (comm := [s["comm_bytes"] for s in steps
                                                                     if s.get("comm_bytes") is not None]) else None,
        # What the job's ranks together sent to other nodes per step, as DDP's hook counts it from the
        # placement's node map (parallel.collectives: flat vs hierarchical); 0 on one node or other layouts.
        "cross_node_bytes_per_step": statistics.median(cross) if (cross := [s["cross_node_bytes"] for s in steps
                                                                           if s.get("cross_node_bytes") is not None])
        else None,
        "restarts": run.restarts,
        "resizes": run.resizes,
        "rollbacks": run.rollbacks,
        "lr_scale": run.lr_scale,
        "warm_workers": run.warm_workers,
        "last_checkpoint_step": run.last_checkpoint_step,
        "params_sha256": result.get("params_sha256"),
        "sdp": result.get("sdp"),  # parallel.sdp: mode, masking, coverage, spectral_gap, held fractions
        "export_path": result.get("export_path"),
        "hf_export_path": result.get("hf_export_path"),  # an hf job: its save_pretrained directory
        "job_dir": run.storage.uri,  # the job's storage: a local path, or a URI on an object store
        "tracking": run.tracking_info(),  # the MLflow run and TensorBoard directory, when the job tracks
        "error": run.error,
    }
    stale = [s["ps_staleness"] for s in steps if s.get("ps_staleness") is not None]
    if stale:  # parallel.parameter_server: how stale the rows trainers read were, and what travelled
        rows = [s["ps_rows"] for s in steps if s.get("ps_rows") is not None]
        summary["parameter_server"] = {"max_staleness": max(stale), "mean_staleness": statistics.fmean(stale),
                                       "rows_per_step": statistics.median(rows) if rows else None,
                                       # async: ranks lost while the others trained on (the last attempt's)
                                       "lost_trainers": sorted(getattr(run, "lost_trainers", ()))}
    lag = [s for s in steps if s.get("pipeline_staleness") is not None]
    if lag:  # pipedream / pipedream_2bw: how late the applied gradients were, the weight copies kept for them
        summary["pipeline_async"] = {
            "max_staleness": max(s["pipeline_staleness"] for s in lag),
            "mean_staleness": statistics.fmean(s["pipeline_staleness"] for s in lag),
            "weight_versions": max(s["pipeline_weight_versions"] for s in lag),
            "stashed_weight_bytes": max(s["pipeline_stashed_weight_bytes"] for s in lag)}
    if spec.parallel.compression is not None:  # what DDP's hook sent against its fp32 all-reduce, per step
        summary["compression"] = compression_summary(spec.parallel.compression.kind, steps)
    auc = (result.get("validation") or {}).get("auc")
    if auc is not None:  # a binary classifier (train.loss 'bce'): the final validation's AUC
        summary["final_val_auc"] = auc
    return summary
