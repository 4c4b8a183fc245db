"""Joins per-rank step records into one job-level record per step."""

from __future__ import annotations

import statistics

from service.metric_catalogue import mfu
from workers.parallel.pipeline.bubble import join_stage_reports


class StepAggregator:
    def __init__(self, world_size: int, global_batch_size: int):
        self.world_size, self.global_batch_size = world_size, global_batch_size
        self.expected = set(range(world_size))  # the ranks whose record a step waits for
        self.started = world_size  # the attempt's world size; fewer ranks in a step: lost ones (async PS)
        self.joined_from: dict[int, int] = {}  # a rank that joined a running job -> the first step that waits for it
        self.last_joined = 0  # the newest step joined so far
        self._pending: dict[int, dict[int, dict]] = {}

    def add(self, record: dict) -> dict | None:
        """Add one rank's record; return the job-level record once every rank reported the step."""
        step = record["step"]
        if step < self.joined_from.get(record["rank"], 0) and step not in self._pending:
            return None  # a joined rank's record of a step the others finished before it came: told already
        ranks = self._pending.setdefault(step, {})
        ranks[record["rank"]] = record
        if not self._expected_at(step) <= ranks.keys():
            return None
        del self._pending[step]
        self.last_joined = max(self.last_joined, step)
        return self._join([ranks[r] for r in sorted(ranks)])

    def _expected_at(self, step: int) -> set[int]:
        return self.expected - {r for r, first in self.joined_from.items() if step < first}

    def add_rank(self, rank: int) -> None:
        """Rank `rank` joined the running job (the parameter server's async trainers): steps newer than every
        one reported so far wait for it too (the ones before may have gone without it)."""
        newest = max([self.last_joined, *self._pending])
        self.expected.add(rank)
        self.world_size = len(self.expected)
        self.joined_from[rank] = newest + 1

    def drop_rank(self, rank: int) -> list[dict]:
        """Rank `rank` is lost and the others go on (the parameter server's async trainers): steps wait no
        more for it; the steps every other rank had already reported, joined (with its record where it had)."""
        self.expected.discard(rank)
        self.joined_from.pop(rank, None)
        self.world_size = len(self.expected)
        done = [step for step, ranks in self._pending.items() if self._expected_at(step) <= ranks.keys()]
        joined = [self._join([r for _, r in sorted(self._pending.pop(step).items())]) for step in sorted(done)]
        self.last_joined = max([self.last_joined, *done])
        return joined

    def flush(self) -> list[dict]:
        """Steps some ranks reported before the group broke, joined from those ranks only (`partial`)."""
        joined = []
        for step in sorted(self._pending):
            record = self._join([self._pending[step][r] for r in sorted(self._pending[step])])
            record["partial"] = True  # the loss is the mean over the ranks that reported
            joined.append(record)
        self._pending.clear()
        return joined

    def _join(self, ranks: list[dict]) -> dict:
        step_time = max(r["step_time_s"] for r in ranks)  # the step ends when the slowest rank ends
        tokens = sum(r["tokens"] for r in ranks)
        stages, bubble, bubble_theory = join_stage_reports([r["stage"] for r in ranks if r.get("stage")])
        peaks = [r.get("peak_flops_per_s") for r in ranks]  # for MFU: known only if every worker's is
        known = [float(p) for p in peaks if p is not None]
        peak = min(known) if known and len(known) == len(peaks) else None
        tokens_per_s = tokens / step_time if step_time > 0 and tokens else None
        # A step some ranks were lost from (the parameter server's async trainers) trained only their samples.
        samples = self.global_batch_size if len(ranks) >= self.started else sum(r["samples"] for r in ranks)
        joined = {
            "step": ranks[0]["step"],
            # Equal data slices: the job's loss is the mean of the ranks that compute one.
            "loss": statistics.fmean(r["loss"] for r in ranks if r["loss"] is not None),
            "step_time_s": step_time,
            "samples_per_s": samples / step_time if step_time > 0 else None,
            "tokens_per_s": tokens_per_s,
            "grad_norm": ranks[0]["grad_norm"],
            "lr": ranks[0]["lr"],
            "comm_bytes": ranks[0]["comm_bytes"],
            "comm_bytes_uncompressed": ranks[0].get("comm_bytes_uncompressed"),
            "model_state_bytes": ranks[0].get("model_state_bytes"),
            "peak_flops_per_s": peak,
            "model_params": ranks[0].get("model_params"),
            "bubble_fraction": bubble,
            "skipped": any(r.get("skipped") for r in ranks),
            "memory_tracked": any(r.get("memory_tracked") for r in ranks),
            "skip_reason": next((r["skip_reason"] for r in ranks if r.get("skip_reason")), None),
            "bubble_fraction_theoretical": bubble_theory,
            "ts": max(r["ts"] for r in ranks),
            "ranks": [
                {"rank": r["rank"], "compute_time_s": r["compute_time_s"], "samples": r["samples"],
                 "comm_time_s": r["comm_time_s"], "step_time_s": r["step_time_s"],
                 "model_state_bytes": r.get("model_state_bytes"), "peak_memory_bytes": r.get("peak_memory_bytes"),
                 "peak_memory_breakdown": r.get("peak_memory_breakdown"),
                 "peak_activation_bytes": r.get("peak_activation_bytes")}
                for r in ranks
            ],
        }
        # MFU of the step (6 x params FLOPs per token against every worker's peak): a GPU whose peak is
        # known, or TRAINYARD_PEAK_FLOPS_PER_WORKER; a CPU step has no peak, so no key (the console says so).
        utilisation = mfu(tokens_per_s, ranks[0].get("model_params"), peak or 0.0, len(ranks))
        if utilisation is not None:
            joined["mfu"] = utilisation
        memory_peaks = [r.get("peak_memory_bytes") for r in ranks]
        if any(p is not None for p in memory_peaks):  # a measured step (CPU measures on a schedule)
            joined["peak_memory_bytes_per_rank"] = memory_peaks
        routed = [r["expert_tokens"] for r in ranks if r.get("expert_tokens")]
        if routed:  # MoE: tokens per expert over the job's ranks, and how uneven (busiest / mean)
            joined["expert_tokens"] = [sum(col) for col in zip(*routed)]
            mean = statistics.fmean(joined["expert_tokens"])
            joined["expert_load_imbalance"] = max(joined["expert_tokens"]) / mean if mean else None
        if stages:  # pipeline jobs: busy/comm/idle, bubble and activations in flight per stage
            joined["stages"] = stages
        crossed = [r["cross_node_bytes"] for r in ranks if r.get("cross_node_bytes") is not None]
        if crossed:  # what every rank together sent to other nodes (DDP's hooks, from the placement's node map)
            joined["cross_node_bytes"] = sum(crossed)
        stale = [r["ps_staleness"] for r in ranks if r.get("ps_staleness") is not None]
        if stale:  # parameter server: the stalest rows any trainer read this step, and the rows that travelled
            joined["ps_staleness"] = max(stale)
            joined["ps_rows"] = sum(r.get("ps_rows") or 0 for r in ranks)
        lag = [r for r in ranks if r.get("pipeline_staleness") is not None]
        if lag:  # pipedream / 2BW: the stalest gradient a stage applied, the weight copies its busiest rank held
            joined["pipeline_staleness"] = max(r["pipeline_staleness"] for r in lag)
            joined["pipeline_weight_versions"] = max(r["pipeline_weight_versions"] for r in lag)
            joined["pipeline_stashed_weight_bytes"] = max(r["pipeline_stashed_weight_bytes"] for r in lag)
        val = [r["val_loss"] for r in ranks if r.get("val_loss") is not None]
        if val:
            joined["val_loss"] = statistics.fmean(val)
        covered = [r["validation"] for r in ranks if r.get("validation")]  # every rank's says the same
        if covered:
            joined["validation"] = covered[0]
        return joined
