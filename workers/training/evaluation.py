"""A rank's validation pass: the model its strategy evaluates (its hooks: workers/parallel/loop_hooks.py),
the loss summed over the data-parallel (x context-parallel) ranks on the CPU, and its batches reported as
progress. What is computed, over which batches, is validation.py's."""

from __future__ import annotations

from workers.parallel.parallelize import sequence_shard
from workers.phases import Phase
from workers.training.rank_state import RankState
from workers.training.validation import Validation, rank_batch_count, validate


class Evaluation(RankState):
    def evaluate(self, what: str = "validation", alone: bool = False) -> Validation:
        """The validation loss and what it covered, reporting its batches as they go (a long validation
        is progress, not a hang). `alone`: this rank validates every batch itself, no collective (the
        parameter server's async lead, whose peers do not meet it)."""
        # The module this rank trains, unless its strategy says otherwise: an SDP rank holds a subnetwork and
        # assembles the whole model (collective); a parameter server copies its shards' rows into the tables.
        model = self.strategy.hooks.evaluation_model(self.model)
        # The reported loss is a host value: summed over dp (x cp) through the CPU mirror of those groups.
        group = self.control_groups.mirror(self.dims, "dp_cp") if self.dims.size("dp_cp") > 1 and not alone else None
        dp_rank, dp = (0, 1) if alone else (self.dp_rank, self.dp)
        meter = self.reporter.phase(Phase.EVALUATING, rank_batch_count(self.val_set, self.spec, dp,
                                                                       self.eval_batches), self.step, what)
        progress = meter.update
        if what == "final validation" and self.faults.faults:  # an injected crash may strike halfway through
            def progress(done: int, total: int | None = None) -> None:
                meter.update(done, total)
                self.faults.in_final_validation(self.step, done, meter.progress.total or 0)
        return validate(model, self.val_set, self.spec, dp_rank, dp, self.device, self.eval_batches,
                        group, progress=progress, shard=sequence_shard(self.dims, self.rank))
