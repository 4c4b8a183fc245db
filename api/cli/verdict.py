"""`trainyard validate`'s answer for a valid spec: one line with the layout, the workers and the
predicted peak memory per worker (workers/parallel/memory_fit.py), or why it is not predicted."""

from __future__ import annotations

from pathlib import Path

from workers.spec import JobSpec


def layout_label(spec: JobSpec) -> str:
    """`dp2`, `tp2 x dp2`, `pp2 x tp2 x cp2 x dp2 x ep2`: the degrees above 1, outermost first (`dp1`: one
    worker); ep last, since it borrows data-parallel ranks."""
    p = spec.parallel
    degrees = [("pp", p.pp), ("tp", p.tp), ("cp", p.cp), ("dp", spec.dp), ("ep", p.ep)]
    parts = [f"{name}{n}" for name, n in degrees if n > 1]
    return " x ".join(parts) or "dp1"


def verdict(spec: JobSpec, path: Path) -> str:
    from workers.parallel.memory_fit import predict

    workers = spec.world_size
    on = f"{workers} worker{'s' if workers != 1 else ''}"
    prediction = predict(spec)
    if spec.program is not None:
        return f"{path}: valid: a program on {layout_label(spec)}, {on}; {prediction.why_not}"
    if prediction.peak_bytes is None:
        return f"{path}: valid: {layout_label(spec)}, {on}; {prediction.why_not}"
    strategy = prediction.estimate.strategy
    if strategy == "zero":  # ZeRO 1 or 2 (3 is fsdp)
        strategy = f"zero {spec.parallel.zero}"
    return (f"{path}: valid: {layout_label(spec)} ({strategy}), {on}, "
            f"predicted peak {_size(prediction.peak_bytes)} per worker")


def _size(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"
