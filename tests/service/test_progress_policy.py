"""Progress, not steps: the hang policy and the supervisor's progress watch on hand-built statuses and
events (no cluster), the rank's throttled reporter, the out-of-memory failure policy, the memory admission
check and the validation defaults."""

from __future__ import annotations

import pytest

from service.supervisor.policies.failure import FailureAction, FailureStatus, RestartsUsed, on_failure
from service.supervisor.policies.hang import HangStatus, RankPhase, on_silence
from service.supervisor.progress_watch import ProgressWatch
from tests.helpers import spec_of, tiny_spec
from workers.events import RankProgress, RankStep, RestartCause
from workers.phases import Phase, Progress
from workers.spec import FaultToleranceSpec, JobSpec
from workers.spec_loading import parse_spec
from workers.training.progress import ProgressReporter

EVAL = Phase.EVALUATING


def status(now: float, last: float, *ranks: RankPhase, judged: bool = True) -> HangStatus:
    return HangStatus(now, last, 3.0, judged, ranks)


def test_silence_within_the_timeout_is_no_hang_whatever_the_phase():
    evaluating = RankPhase(0, Progress(EVAL, 10, 3125, 4, "final validation"), 100.0)
    assert on_silence(status(102.9, 100.0, evaluating)) is None
    assert on_silence(status(500.0, 100.0, evaluating, judged=False)) is None  # a silent program only dies


def test_a_hang_names_the_phase_of_the_rank_that_advanced_last():
    waiting = RankPhase(1, Progress(EVAL, 1200, 3125, 4, "final validation"), 90.0)
    uploading = RankPhase(0, Progress(Phase.UPLOADING_CHECKPOINT, 40, 100, 4, "step 4"), 100.0)
    decision = on_silence(status(103.5, 100.0, waiting, uploading))
    assert decision is not None
    assert decision.reason == "no progress for 3s (hang) while uploading checkpoint (step 4) 40% of 0.0 MB (rank 0)"
    stepping = RankPhase(0, Progress(Phase.TRAINING, 7, 20), 100.0)
    assert on_silence(status(104.0, 100.0, stepping)).reason == "no progress for 3s (hang) after step 7 (rank 0)"


def watch() -> ProgressWatch:
    return ProgressWatch(started_s=0.0, total_steps=4, event_after_s=1.5, event_every_s=3.0)


def evaluating(rank: int, done: int) -> RankProgress:
    return RankProgress(rank, Progress(EVAL, done, 100, 4, "final validation"))


def test_only_advancing_reports_are_progress():
    w = watch()
    assert w.observe(RankStep({"rank": 0, "step": 4}), 1.0)
    assert w.observe(evaluating(0, 0), 2.0)  # a new phase is progress
    assert w.observe(evaluating(0, 5), 3.0)
    assert not w.observe(evaluating(0, 5), 9.0)  # the same report again is not
    assert w.last_progress_s == 3.0
    # so the hang timer runs from the last advance: 9.0 - 3.0 > 3 s
    assert on_silence(HangStatus(9.0, w.last_progress_s, 3.0, True, tuple(w.ranks.values()))) is not None


def test_long_phases_become_events_at_a_bounded_rate():
    w = watch()
    w.observe(evaluating(0, 0), 10.0)
    assert w.phase_events(11.0) == []  # under event_after_s: quick phases stay out of the events
    w.observe(evaluating(0, 40), 11.6)
    [first] = w.phase_events(11.6)
    assert first.progress.done == 40 and first.elapsed_s == pytest.approx(1.6)
    assert first.message == "rank 0: evaluating (final validation) 40/100 batches (2s in this phase)"
    w.observe(evaluating(0, 60), 12.0)
    assert w.phase_events(12.0) == []  # at most every event_every_s
    w.observe(evaluating(0, 90), 14.7)
    assert [e.progress.done for e in w.phase_events(14.7)] == [90]
    w.observe(RankStep({"rank": 0, "step": 5}), 15.0)
    assert w.phase_events(30.0) == []  # training is reported by its steps


def test_the_job_views_phase_is_the_lead_ranks_while_not_training():
    w = watch()
    assert w.phase_view() is None  # nothing heard yet
    w.observe(RankStep({"rank": 0, "step": 4}), 9.0)
    assert w.phase_view() is None  # training: the view's step says it
    w.observe(evaluating(1, 60), 10.0)
    assert w.phase_view() == {"name": "evaluating", "done": 60, "total": 100, "unit": "batches", "step": 4,
                              "what": "final validation", "rank": 1,
                              "message": "evaluating (final validation) 60/100 batches"}
    w.observe(RankProgress(0, Progress(Phase.UPLOADING_CHECKPOINT, 40, 100, 4, "step 4")), 11.0)
    assert w.phase_view()["message"] == "uploading checkpoint (step 4) 40% of 0.0 MB"
    w.observe(RankStep({"rank": 0, "step": 5}), 12.0)
    assert w.phase_view() is None


def test_the_reporter_sends_phase_entries_and_ends_and_throttles_the_rest():
    sent, clock = [], [0.0]
    reporter = ProgressReporter(1, interval_s=0.5, emit=sent.append, clock=lambda: clock[0])
    meter = reporter.phase(EVAL, total=100, step=4, what="final validation")
    for done in range(1, 101):
        clock[0] += 0.01  # 100 batches in 1 s
        meter.update(done)
    assert [e.progress.done for e in sent] == [0, 50, 100]  # entry, one per 0.5 s, the end
    assert all(e.rank == 1 for e in sent)


def test_the_reporter_holds_reports_until_it_has_somewhere_to_send_them():
    sent = []
    reporter = ProgressReporter(0, interval_s=0.0)
    reporter.phase(Phase.OPENING_DATA, total=1).update(1)
    reporter.phase(Phase.BUILDING_MODEL, total=3)
    reporter.attach(sent.append)
    assert [(e.progress.phase, e.progress.done) for e in sent] == [(Phase.OPENING_DATA, 1), (Phase.BUILDING_MODEL, 0)]


def test_out_of_memory_fails_at_once_whatever_the_budget_left():
    decision = on_failure(FailureStatus("rank 1 failed: OutOfMemory: rank 1 ran out of memory in step 2",
                                        RestartsUsed(), FaultToleranceSpec(max_restarts=3), steps_done=1,
                                        retryable=False, cause=RestartCause.OUT_OF_MEMORY))
    assert decision.action == FailureAction.FAIL and decision.cause == RestartCause.OUT_OF_MEMORY
    assert "not retryable (out of memory)" in decision.reason


TERABYTE = tiny_spec(model={"name": "gpt", "n_layers": 256, "d_model": 16384, "n_heads": 128, "seq_len": 64},
                     **{"parallel.dp": 4, "parallel.zero": 3, "resources.workers": 4})


def test_the_analytic_gpt_count_is_the_model_built_on_the_meta_device():
    from workers.parallel.memory_fit import gpt_facts
    from workers.parallel.planner import ModelFacts

    for overrides in ({}, {"model.n_layers": 3, "model.d_model": 48, "model.vocab_size": 300, "model.seq_len": 24}):
        spec = spec_of(**overrides)
        assert gpt_facts(spec) == ModelFacts.of(spec)


def test_a_model_bigger_than_the_budget_is_refused_with_the_figures():
    from workers.parallel.memory_fit import GIB, MemoryBudget, memory_violation, predicted_peak, spec_budget

    spec = parse_spec(TERABYTE)
    node = MemoryBudget(64 * GIB, "the largest node's memory (64.00 GiB)", "resources")
    refusal = memory_violation(spec, [node])
    assert refusal is not None and refusal.field == "resources"
    assert "824.70 B parameters" in refusal.message and "per worker" in refusal.message
    assert "more than the largest node's memory (64.00 GiB)" in refusal.message
    assert predicted_peak(spec) > 2000 * GIB  # FSDP over 4 workers: still terabytes each
    small = spec_of()
    assert memory_violation(small, [node]) is None
    tight = spec_of(**{"resources.memory_per_worker_gib": 0.001})  # 1 MiB: below the tiny GPT's ~1.2 MiB
    refusal = memory_violation(tight, [spec_budget(tight), node])
    assert refusal is not None and refusal.field == "resources.memory_per_worker_gib"


def test_a_hugging_face_model_is_predicted_on_the_meta_device_and_a_program_is_said_not_to_be():
    from workers.parallel.memory_fit import GIB, MemoryBudget, memory_view, memory_violation, predict

    big = {"model_type": "llama", "config": {"hidden_size": 4096, "num_hidden_layers": 2, "num_attention_heads": 32,
                                             "intermediate_size": 11008, "vocab_size": 32000}}
    spec = spec_of(model={"hf": big}, **{"data.seq_len": 64})
    node = MemoryBudget(4 * GIB, "the largest node's memory (4.00 GiB)", "resources")
    refusal = memory_violation(spec, [node])  # 0.67 B parameters on one worker: ~10 GiB of state with AdamW
    assert refusal is not None and "the model (hf llama, 2 layers: 0.67 B parameters)" in refusal.message, refusal
    assert memory_view(spec, [node])["peak_per_worker_gib"] > 4
    program = parse_spec({"name": "prog", "program": {"function": "m:f"}})
    assert predict(program).peak_bytes is None and memory_violation(program, [node]) is None
    assert memory_view(program, [node]) == {"predicted": False, "reason": "a program's memory is its own (program): "
                                            "not predicted; a rank out of memory fails the job at once"}


def test_validation_is_bounded_by_default_and_whole_on_request():
    from workers.training.validation import DEFAULT_EVAL_BATCHES, eval_batches_of, eval_micro_batch_size

    train, val = object(), object()

    def of(value) -> int | None:
        return eval_batches_of(JobSpec.model_validate({"name": "x", "train": {"eval_batches": value}}), train, val)

    assert of("auto") == DEFAULT_EVAL_BATCHES == 8 and of(3) == 3
    assert of("all") is None and of(None) is None  # null keeps its old meaning: the whole split
    assert eval_batches_of(JobSpec.model_validate({"name": "x"}), train, train) == 2  # no separate split
    spec = JobSpec.model_validate({"name": "x", "train": {"micro_batch_size": 4}})
    assert eval_micro_batch_size(spec) == 8  # no backward: twice the training micro-batch
