"""What a supervisor keeps of its run's steps: bounded, whatever the run's length or world size.

The job-level step records (service/supervisor/aggregate.py) carry one entry per rank: 1-3 MiB a
step at 4,096 ranks, so keeping them all made a long run's supervisor grow without bound. Kept here:
- the last RECENT records whole (what a restart replays over, what a reader of the run looks at);
- a compact sample of every step, without the per-rank entries, thinned to every other one
  whenever it reaches MAX_SAMPLES (so it spans the whole run at a coarser stride): the summary's
  steady-state throughput, bubble and communication figures are taken over it;
- running aggregates over every step: the first step, the latest, each rank's peak memory.
The database keeps the thinned per-step history (service/db/repository.py record_steps).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

RECENT = 4  # whole records at 4,096 ranks are 1-3 MiB each: only the newest few
MAX_SAMPLES = 2048
# what the summary reads of a step (service/supervisor/summary.py, pipeline_summary)
SAMPLED = ("step", "loss", "step_time_s", "samples_per_s", "tokens_per_s", "comm_bytes", "comm_bytes_uncompressed",
           "cross_node_bytes", "bubble_fraction", "memory_tracked", "partial", "stages", "grad_norm", "lr",
           "ps_staleness", "ps_rows", "pipeline_staleness", "pipeline_weight_versions",
           "pipeline_stashed_weight_bytes")


class StepHistory:
    def __init__(self) -> None:
        self.recent: deque[dict] = deque(maxlen=RECENT)
        self.samples: list[dict] = []
        self.stride = 1  # one sample per `stride` steps
        self.first: dict | None = None  # the run's first step, compact
        self._peaks: dict[int, list[int | None]] = {}  # world size -> each rank's highest measured peak

    def append(self, record: dict) -> None:
        """A joined step; a step at or before one already kept is a replay after a restart: it replaces
        what follows it."""
        step = record["step"]
        if self.recent and self.recent[-1]["step"] >= step:
            self._forget_from(step)
        self.recent.append(record)
        compact = {k: record[k] for k in SAMPLED if record.get(k) is not None}
        if self.first is None:
            self.first = compact
        if step % self.stride == 0:
            self.samples.append(compact)
            if len(self.samples) >= MAX_SAMPLES:  # halve the resolution: the sample still spans the run
                self.stride *= 2
                self.samples = [s for s in self.samples if s["step"] % self.stride == 0]
        self._note_peaks(record)

    def _forget_from(self, step: int) -> None:
        self.recent = deque((r for r in self.recent if r["step"] < step), maxlen=RECENT)
        self.samples = [s for s in self.samples if s["step"] < step]
        if self.first is not None and self.first["step"] >= step:
            self.first = None

    def _note_peaks(self, record: dict) -> None:
        ranks = record.get("ranks") or ()
        if not ranks or record.get("partial"):
            return
        peaks = self._peaks.setdefault(len(ranks), [None] * len(ranks))
        for r in ranks:
            value = r.get("peak_memory_bytes")
            if value is not None and 0 <= r["rank"] < len(peaks):
                peaks[r["rank"]] = max(value, peaks[r["rank"]] or 0)

    # --- what the run and its summary read ----------------------------------------------------

    def __bool__(self) -> bool:
        return bool(self.recent)

    def __iter__(self) -> Iterator[dict]:
        """The sampled steps, oldest first (the summary's steady-state figures are taken over them)."""
        return iter(self.samples)

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def last(self) -> dict | None:
        return self.recent[-1] if self.recent else None

    @property
    def last_step(self) -> int:
        return self.recent[-1]["step"] if self.recent else 0

    def peak_memory_per_rank(self, world_size: int) -> list[int | None] | None:
        """Each rank's largest measured step peak over the steps of this world size; None if none was measured."""
        peaks = self._peaks.get(world_size)
        return list(peaks) if peaks and any(p is not None for p in peaks) else None
