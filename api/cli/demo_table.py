"""`make demo`'s summary table, fitted to the terminal: columns that do not fit are left out
(least needed first) instead of every cell being cut to `SUCCE…`; job names fold if they must."""

from __future__ import annotations

from datetime import datetime

from rich.table import Table

from api.cli.output import steps_of

# Each column and how much it is needed: 0 always shown, higher numbers leave first.
COLUMNS = (("job", 0), ("state", 0), ("loss", 0), ("steps", 1), ("restarts", 2), ("samples/s", 3),
           ("wall", 4), ("id", 5))
BORDER_PER_COLUMN = 3  # "│ " before a cell and the space after it


def summary_row(job: dict) -> dict[str, str]:
    s = job.get("summary") or {}
    start, end = s.get("initial_loss"), s.get("final_loss")
    wall = "-"
    if job.get("started_at") and job.get("finished_at"):
        elapsed = datetime.fromisoformat(job["finished_at"]) - datetime.fromisoformat(job["started_at"])
        wall = f"{elapsed.total_seconds():.0f}s"
    rate = s.get("samples_per_s")
    return {"job": job["name"], "id": job["id"], "state": job["state"], "steps": steps_of(job),
            "loss": f"{start:.2f}→{end:.2f}" if start is not None and end is not None else "-",
            "samples/s": f"{rate:,.0f}" if rate else "-", "restarts": str(job["restarts"]), "wall": wall}


def fitted_columns(rows: list[dict[str, str]], width: int) -> list[str]:
    """The columns to show within `width` characters, in table order."""
    def need(col: str) -> int:
        return max([len(col)] + [len(r[col]) for r in rows]) + BORDER_PER_COLUMN

    shown = [name for name, _ in COLUMNS]
    for name, rank in sorted(COLUMNS, key=lambda c: -c[1]):
        if sum(need(c) for c in shown) + 1 <= width or rank == 0:
            break
        shown.remove(name)
    return shown


def summary_table(jobs: list[dict], width: int) -> Table:
    rows = [summary_row(j) for j in jobs]
    columns = fitted_columns(rows, width)
    table = Table(title="Trainyard demo: summary")
    for col in columns:  # the job name may fold over two lines; no other cell is ever cut
        table.add_column(col, no_wrap=col != "job", overflow="fold" if col == "job" else "ellipsis")
    for r in rows:
        table.add_row(*(r[c] for c in columns))
    return table
