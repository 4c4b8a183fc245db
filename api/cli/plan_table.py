"""What `trainyard plan` prints: one row per layout, a column per parallel key some row sets, and
the layouts it leaves out with the reason."""

from __future__ import annotations

import json

from rich.table import Table

from workers.parallel.planner import AUTO_LEAVES_OUT, Plan

DEGREES = ("pp", "tp", "dp", "zero")  # every row has these (pp 1 when not set)


def layout_table(result: Plan, title: str) -> Table:
    """The candidates, best first; `*` marks the choice of `parallel: auto`. An option column (dp_shard,
    sequence_parallel, ...) appears only when some row sets it, so no column is blank on every row."""
    options = list(dict.fromkeys(k for e in result.candidates for k in e.parallel if k not in DEGREES))
    table = Table(title=title)
    for col in ("", *DEGREES, *options, "strategy", "state@peak MiB/rank", "act MiB/rank", "comm MB/step",
                "step ms", "fits"):
        table.add_column(col)
    for e in result.candidates:
        degrees = [str(e.parallel.get(k, 1 if k == "pp" else "")) for k in DEGREES]
        values = [_value(e.parallel[k]) if k in e.parallel else "" for k in options]
        table.add_row("*" if e is result.chosen else "", *degrees, *values, e.strategy,
                      f"{e.peak_state_bytes_per_rank / 2**20:.2f}", f"{e.activation_bytes_per_rank / 2**20:.2f}",
                      f"{e.comm_bytes_per_step / 1e6:.3f}", f"{e.step_s * 1e3:.2f}", "yes" if e.fits else "no")
    return table


def _value(v: object) -> str:
    return str(v) if isinstance(v, int) and not isinstance(v, bool) else json.dumps(v)


def left_out(result: Plan) -> list[str]:
    """The layouts not in the table and why (those the spec's rules refuse, grouped by reason), and
    why `parallel: auto` passes over the pipeline layouts the table holds."""
    by_reason: dict[str, list[str]] = {}
    for r in result.rejected:
        by_reason.setdefault(r["reason"], []).append(_label(r["parallel"]))
    lines = [f"left out: {', '.join(layouts)}: {reason}" for reason, layouts in by_reason.items()]
    if any(not e.auto_eligible for e in result.candidates):
        lines.append(f"{AUTO_LEAVES_OUT}; each pipeline row uses the default schedule 1f1b "
                     f"(parallel.pipeline.schedule picks another)")
    return lines


def _label(parallel: dict) -> str:
    options = "".join(f" {k}={_value(v)}" for k, v in parallel.items() if k not in DEGREES)
    return f"pp{parallel.get('pp', 1)} x tp{parallel['tp']} x dp{parallel['dp']} zero {parallel['zero']}{options}"
