"""The supervisor's numbered buffer of what its run reported (state changes, events, step records).

The reconciler drains it with `drain(ack)`: records up to `ack` are stored in the database and
dropped here, the rest are returned again, so a control plane that dies between a drain and its
commit loses nothing and stores nothing twice. Only the newest step record keeps its per-rank
entries, so what waits for a late drain grows by a step's job-level fields, not by its ranks.
Used by the supervisor actor and, unchanged, by the fleet simulator's supervisors (bench/fleet/).
"""

from __future__ import annotations

import threading
import time

from service.rank_times import compact_rank_times

MAX_BUFFERED_STEPS = 5000  # a control plane away for long: older steps are thinned, never the newest


class RecordBuffer:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[dict] = []
        self.seq = 0  # the last record's number
        self._ranked: dict | None = None  # the newest step record, the only one that keeps its per-rank entries

    def push(self, record: dict) -> None:
        with self._lock:
            self.seq += 1
            record["seq"] = self.seq
            record.setdefault("ts", time.time())
            if record["type"] == "step" and record.get("ranks"):
                if self._ranked is not None:
                    _drop_ranks(self._ranked)
                self._ranked = record
            self._records.append(record)
            steps = [r for r in self._records if r["type"] == "step"]
            if len(steps) > MAX_BUFFERED_STEPS:  # drop every other old step, keep the newest half intact
                old = {id(r) for r in steps[: len(steps) // 2 : 2]}
                self._records = [r for r in self._records if id(r) not in old]

    def drain(self, ack: int) -> list[dict]:
        """Forget records up to `ack` (stored by the caller); the rest, oldest first."""
        with self._lock:
            self._records = [r for r in self._records if r["seq"] > ack]
            return list(self._records)


def _drop_ranks(record: dict) -> None:
    """A step record that is no longer the newest loses its per-rank entries (4,096 of them on a large
    job: a control plane that drains late would get megabytes a step). The control plane's metrics read
    only the newest step's ranks; what the database keeps of them (a measured step's per-rank memory
    breakdown) stays, under its own key."""
    ranks = record.pop("ranks", None)
    record.update(compact_rank_times(ranks or []))  # the console's rank heatmap, for jobs up to 256 ranks
    if ranks and record.get("peak_memory_bytes_per_rank"):
        record["peak_memory_breakdown_per_rank"] = [r.get("peak_memory_breakdown") for r in ranks]
