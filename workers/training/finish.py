"""After the last step: the final checkpoint, the final validation and the export, each reporting its
progress, and the rank's final result (with what its strategy adds: workers/parallel/loop_hooks.py). A
restart after the last step resumes into the phases left (final_phases.py)."""

from __future__ import annotations

from typing import Callable

from workers import checkpointing
from workers.events import RankCheckpoint, RankEvent
from workers.models import hf_source
from workers.models.hf import save_pretrained
from workers.phases import Phase
from workers.spec import HFModelSpec
from workers.training.checkpoints import Checkpoints
from workers.training.evaluation import Evaluation
from workers.training.final_phases import FinalPhases
from workers.training.train_step import StepTraining


class Finishing(StepTraining, Checkpoints, Evaluation):
    def finish(self, emit: Callable[[RankEvent], None]) -> dict:
        """After the last step: the final checkpoint, the final validation, the export, each reporting its
        progress. A restart after the last step resumes into the phases left (final_phases.py)."""
        if self.strategy.hooks.trains_alone:
            return self._finish_alone(emit)
        self._report_durable(emit, self._wait_for_save())
        if self.step < self.spec.train.steps:
            return {"stopped_at": self.step}
        self.feed.close()
        self._check_replicas_agree(force=True)  # the final checkpoint is verified too, whatever its step
        if self.resumed_step != self.step:  # resumed from the final checkpoint: it is there already
            self._save()
            self._wait_for_save()
        emit(RankCheckpoint(self.rank, self.step, self.checkpointer.last_duration_s))
        done = FinalPhases.load(self.storage, self.step)
        self.control_groups.barrier()  # every rank has read what is done before rank 0 may record more
        writer = self.rank == 0
        if self.model_state_bytes is not None and done.get("model_state_bytes") is None:
            done.record("model_state_bytes", self.model_state_bytes, writer)
        validation = done.get("validation")
        if validation is None:
            validation = self.evaluate("final validation").as_record()
            done.record("validation", validation, writer)
        result: dict[str, object] = {"step": self.step, "model_state_bytes": done.get("model_state_bytes"),
                                     "val_loss": validation["loss"], "validation": validation}
        result.update(self.strategy.hooks.final_report())  # SDP: masks, spectral gap, held fractions
        exported = done.get("export")
        if exported is None:
            exported = self._export()
            self.control_groups.barrier()  # every rank past the gather: rank 0's record says it is done
            done.record("export", exported, writer)
        result.update(exported if writer else {})
        self.control_groups.barrier()
        return result

    def _finish_alone(self, emit: Callable[[RankEvent], None]) -> dict:
        """finish() for ranks that never meet (the parameter server's async trainers): each waits until every
        live rank trained its last step (the shards know), then the lead alone saves the final checkpoint,
        validates every batch and exports; the others return their step. No collective: a lost rank, rank 0
        included, blocks nothing. (Its phases are redone by a restart after the last step.)"""
        self._report_durable(emit, self._wait_for_save())
        if self.step < self.spec.train.steps:
            return {"stopped_at": self.step}
        self.feed.close()
        if not self.strategy.hooks.wait_for_peers(self.spec.train.steps):
            return {"step": self.step}
        if self.resumed_step != self.step:
            self._save()
            self._wait_for_save()
        emit(RankCheckpoint(self.rank, self.step, self.checkpointer.last_duration_s))
        validation = self.evaluate("final validation", alone=True).as_record()
        result: dict[str, object] = {"step": self.step, "model_state_bytes": self.model_state_bytes,
                                     "val_loss": validation["loss"], "validation": validation, "lead": self.rank}
        result.update(self.strategy.hooks.final_report())
        result.update(self._export(writer=True))
        return result

    def _export(self, writer: bool | None = None) -> dict[str, object]:
        """The whole model gathered (a collective), hashed and written by rank 0 (its paths and hash);
        `writer`: the rank that writes, when not rank 0 (it gathers nothing then)."""
        exporting = self.reporter.phase(Phase.EXPORTING, total=3, step=self.step, what="final model")
        # DTensor shards gathered; a pipeline rank holds only its stages, an SDP worker its subnetwork, a parameter
        # server's tables are on its shards: their strategies' hooks gather the whole model.
        state = self.strategy.hooks.full_model_state(self.model)
        exporting.update(1)
        if not (self.rank == 0 if writer is None else writer):
            return {}
        out: dict[str, object] = {"params_sha256": checkpointing.state_sha256(state)}
        exporting.update(2)
        meta = {"job": self.spec.name, "step": self.step, "spec": self.spec.model_dump(mode="json")}
        out["export_path"] = self._with_store_retries(
            "model export", lambda: checkpointing.export_model(self.storage, state, meta))
        if isinstance(self.spec.model, HFModelSpec):  # also as transformers loads it: hf/ beside it
            source = hf_source(self.spec.model)
            out["hf_export_path"] = self._with_store_retries("hf export", lambda: checkpointing.export_hf(
                self.storage, lambda path: save_pretrained(*source, state, path)))
        exporting.update(3)
        return out
