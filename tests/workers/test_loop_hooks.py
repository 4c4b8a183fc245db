"""A strategy's hooks (workers/parallel/loop_hooks.py), typed instead of probed: the trainer drives a strategy
that declares none (NO_HOOKS: the plain replicate step) and one that declares every hook, on a real gloo
rank (no Ray). The hooked run calls each hook at its point in the loop, with the step it is at, and carries
what the hooks add; the plain run carries nothing extra; both train the same math (the hooks below answer
as the defaults do), so they end with the same losses and the same `params_sha256`. A resume calls
`after_load` with the checkpoint's step. Every registered strategy declares its hooks."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tests.workers.gloo_ranks import spawn_ranks
from workers.parallel.data_parallel.replicate import ReplicateStep
from workers.parallel.loop_hooks import NO_HOOKS, LoopHooks

# 4 steps, a checkpoint at step 2 (and the final one at 4), validation every 2 steps and at the end.
SPEC = {"train.steps": 4, "checkpoint.every_steps": 2, "train.eval_every": 2, "train.eval_batches": 1}


class RecordingHooks(LoopHooks):
    """Every hook recorded, answering as the defaults do (so the math is the plain run's), plus its own keys."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def after_load(self, storage, step, rank, control) -> None:
        self.calls.append(("after_load", step, rank))

    def before_save(self, wrapped, storage, step, rank, control) -> None:
        self.calls.append(("before_save", step, rank))

    def evaluation_model(self, wrapped):
        self.calls.append(("evaluation_model",))
        return super().evaluation_model(wrapped)

    def full_model_state(self, wrapped):
        self.calls.append(("full_model_state",))
        return super().full_model_state(wrapped)

    def step_report(self) -> dict[str, object]:
        self.calls.append(("step_report",))
        return {"hooked_calls": len(self.calls)}

    def final_report(self) -> dict[str, object]:
        self.calls.append(("final_report",))
        return {"hooked": "final"}


class HookedStep(ReplicateStep):
    """The plain replicate step, declaring every hook."""

    def __init__(self) -> None:
        super().__init__()
        self.recording = RecordingHooks()

    @property
    def hooks(self) -> LoopHooks:
        return self.recording


def _run(strategy_class, job: str) -> tuple[list[dict], dict, list[tuple]]:
    from tests.helpers import spec_of
    from workers.events import RankStep
    from workers.training import trainer as trainer_module
    from workers.training.control import RankControl

    strategies: list = []

    def build(spec):
        strategies.append(strategy_class())
        return strategies[-1]

    trainer_module.build_strategy = build  # what the trainer builds its strategy with
    trainer = trainer_module.Trainer(spec_of(**SPEC), 0, 1, torch.device("cpu"), job)
    trainer.resume_from_latest()
    events: list = []
    result = trainer.run(events.append, RankControl())
    records = [e.record for e in events if isinstance(e, RankStep)]
    hooks = strategies[0].hooks
    return records, result, list(hooks.calls) if isinstance(hooks, RecordingHooks) else []


def _both(rank, world, port, queue, tmp: str):
    from pathlib import Path

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    plain = _run(ReplicateStep, str(Path(tmp) / "plain"))
    hooked = _run(HookedStep, str(Path(tmp) / "hooked"))
    resumed = _run(HookedStep, str(Path(tmp) / "hooked"))  # the finished job again: resumes at its last step
    queue.put((rank, plain, hooked, resumed))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    [(_, plain, hooked, resumed)] = spawn_ranks(_both, 1, str(tmp_path_factory.mktemp("loop-hooks")))
    return plain, hooked, resumed


def test_a_strategy_without_hooks_runs_the_plain_loop(runs):
    (records, result, calls), _, _ = runs
    assert [r["step"] for r in records] == [1, 2, 3, 4] and calls == []
    assert not any("hooked_calls" in r for r in records) and "hooked" not in result
    assert result["step"] == 4 and result["params_sha256"] and result["val_loss"] is not None


def test_a_strategy_with_hooks_is_driven_at_each_point_of_the_loop(runs):
    (plain_records, plain_result, _), (records, result, calls), _ = runs
    step, evaluate = ("step_report",), ("evaluation_model",)
    assert calls == [step, step, evaluate, ("before_save", 2, 0),  # step 2: record, validation, checkpoint
                     step, step, evaluate,  # step 4: the final checkpoint is finish()'s
                     ("before_save", 4, 0), evaluate, ("final_report",), ("full_model_state",)]
    # What step_report returned is in its step's record; what final_report returned is in the result.
    assert [r["hooked_calls"] for r in records] == [1, 2, 5, 6]
    assert result["hooked"] == "final"
    # The hooks changed nothing else: the same losses, the same final model.
    assert [r["loss"] for r in records] == [r["loss"] for r in plain_records]
    assert result["params_sha256"] == plain_result["params_sha256"]
    assert result["val_loss"] == plain_result["val_loss"]


def test_a_resume_calls_after_load_with_the_checkpoint_step(runs):
    _, (_, finished, _), (records, result, calls) = runs
    assert records == [] and calls == [("after_load", 4, 0), ("final_report",)]  # validation, export: done
    assert result["hooked"] == "final" and result["params_sha256"] == finished["params_sha256"]


def test_every_registered_strategy_declares_its_hooks():
    from workers.parallel.parameter_server.strategy import ParameterServerStrategy
    from workers.parallel.pipeline.strategy import PipelineStrategy
    from workers.parallel.registry import REGISTRY
    from workers.parallel.sdp.strategy import SDPStrategy

    for strategy_class in REGISTRY:
        assert isinstance(strategy_class().hooks, LoopHooks), strategy_class
    assert ReplicateStep().hooks is NO_HOOKS

    def overridden(hooks: LoopHooks) -> set[str]:
        return {name for name in vars(LoopHooks) if not name.startswith("_")
                and getattr(type(hooks), name) is not getattr(LoopHooks, name)}

    assert overridden(ParameterServerStrategy().hooks) == {"after_load", "before_save", "evaluation_model",
                                                           "full_model_state", "step_report", "trains_alone",
                                                           "join_step", "writes_for_all", "wait_for_peers"}
    assert overridden(SDPStrategy().hooks) == {"evaluation_model", "full_model_state", "final_report"}
    assert overridden(PipelineStrategy().hooks) == {"full_model_state"}
