"""The worker runtime on a real local Ray with real gloo process groups."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from service.supervisor.run import JobRun
from tests.helpers import (
    Events,
    alive_actors,
    live_placement_groups,
    rank_loop_processes,
    spec_of,
    thread_names,
    thread_niceness,
    wait_until,
)
from workers.checkpointing import complete_checkpoints, state_sha256
from workers.data import build_datasets
from workers.data.batches import GlobalBatches
from workers.models import build_model
from workers.runtime.step_aside import ACTOR_NICENESS
from workers.training.losses import LOSSES
from workers.training.validation import eval_batches_of, validation_sums

pytestmark = pytest.mark.slow

RAY_THREADS = {"worker.io", "timer_manager", "gcs_client_io_s"}  # a few of the core worker's, as /proc names them


class Recorder(Events):
    """Events that can also signal when a run reaches a given step."""

    def __init__(self):
        super().__init__()
        self.reached = threading.Event()
        self.wait_for_step = None

    def on_step(self, record):
        super().on_step(record)
        if self.wait_for_step and record["step"] >= self.wait_for_step:
            self.reached.set()


def run_job(spec, tmp_path: Path, name: str = "job", listener=None) -> dict:
    return JobRun(spec, tmp_path / name, name, listener=listener).run()


def listening(addr: str, port: int) -> bool:
    try:
        socket.create_connection((addr, port), timeout=2).close()
        return True
    except OSError:
        return False


def assert_nothing_left():
    assert alive_actors() == []
    assert live_placement_groups() == []


@pytest.mark.exhaustive  # make test: ddp4 against the reference in test_strategies, Llama dp2 in test_user_model_strategies
def test_data_parallel_matches_single_process(ray_cluster, tmp_path):
    losses = {}
    for dp in (1, 2, 4):
        spec = spec_of(**{"resources.workers": dp})
        rec = Recorder()
        summary = run_job(spec, tmp_path, f"dp{dp}", rec)
        assert summary["state"] == "SUCCEEDED" and summary["world_size"] == dp
        losses[dp] = [s["loss"] for s in rec.steps]
        assert len(losses[dp]) == 20
    assert losses[1][-1] < losses[1][0] - 0.5  # it learns
    for dp in (2, 4):
        for step in (9, 19):
            assert losses[dp][step] == pytest.approx(losses[1][step], rel=1e-5), (dp, step)
    assert_nothing_left()


@pytest.mark.exhaustive  # make test: the same restart through `trainyard run --json` (test_cli_run), its states over REST
def test_crash_restarts_and_ends_bit_identical(ray_cluster, tmp_path):
    base = {"resources.workers": 2, "checkpoint.every_steps": 5, "train.steps": 16}
    clean = run_job(spec_of(**base), tmp_path, "clean")
    rec = Recorder()
    faulty = run_job(spec_of(**base, fault_injection=[{"at_step": 13, "rank": 1, "kind": "crash"}]),
                     tmp_path, "faulty", rec)
    assert faulty["state"] == "SUCCEEDED" and faulty["restarts"] == 1
    assert rec.states == ["STARTING", "RUNNING", "RECOVERING", "RUNNING", "SUCCEEDED"]
    restart = [data for kind, data in rec.events if kind == "restart"]
    # The save at step 10 waited for the one at 5, so at least that one is durable.
    assert restart[0]["resume_step"] in (5, 10) and "rank 1 failed" in restart[0]["reason"]
    assert restart[0]["cause"] == "worker_lost"  # its node lives on (a task ran there): the job's budget
    assert faulty["params_sha256"] == clean["params_sha256"]
    assert faulty["final_loss"] == clean["final_loss"]
    assert_nothing_left()


def test_hang_is_detected_and_recovered(ray_cluster, tmp_path):
    spec = spec_of(**{"resources.workers": 2, "checkpoint.every_steps": 3, "train.steps": 8,
                      "fault_tolerance.hang_timeout_s": 4.0},
                   fault_injection=[{"at_step": 5, "rank": 0, "kind": "hang"}])
    rec = Recorder()
    summary = run_job(spec, tmp_path, listener=rec)
    assert summary["state"] == "SUCCEEDED" and summary["restarts"] == 1
    [restart] = [data for kind, data in rec.events if kind == "restart"]
    assert restart["cause"] == "hang"  # the supervisor's timer fires before any peer's collective times out
    assert_nothing_left()


def test_restart_budget_exhausted_fails_and_cleans_up(ray_cluster, tmp_path):
    spec = spec_of(**{"resources.workers": 2, "fault_tolerance.max_restarts": 0},
                   fault_injection=[{"at_step": 3, "rank": 0, "kind": "crash"}])
    summary = run_job(spec, tmp_path)
    assert summary["state"] == "FAILED" and "restart budget exhausted" in summary["error"]
    assert_nothing_left()


def test_bad_user_code_fails_without_retrying(ray_cluster, tmp_path):
    spec = spec_of(model={"entrypoint": "tests.fixtures.user_code:no_such_factory"}, **{"data.seq_len": 32})
    summary = run_job(spec, tmp_path)
    assert summary["state"] == "FAILED" and summary["restarts"] == 0
    assert "no callable 'no_such_factory'" in summary["error"]
    assert_nothing_left()


def test_cancel_mid_run_tears_everything_down(ray_cluster, tmp_path):
    rec = Recorder()
    rec.wait_for_step = 3
    run = JobRun(spec_of(**{"resources.workers": 2, "train.steps": 500}), tmp_path / "c", "c", listener=rec)
    thread = threading.Thread(target=run.run)
    thread.start()
    assert rec.reached.wait(120)
    # Each rank trains in a child of its actor, with far fewer threads (workers/runtime/rank_process.py).
    loops = rank_loop_processes()
    assert len(loops) == 2, loops
    for loop, actor in loops.items():  # Ray's core-worker threads stay in the actor
        assert RAY_THREADS <= thread_names(actor) and not RAY_THREADS & thread_names(loop), (actor, loop)
        # and yield the cores to the loop, which keeps normal priority (workers/runtime/step_aside.py)
        assert set(thread_niceness(actor).values()) == {ACTOR_NICENESS}, thread_niceness(actor)
        assert set(thread_niceness(loop).values()) == {0}, thread_niceness(loop)
    run.cancel()
    thread.join(60)
    assert not thread.is_alive()
    assert run.state == "CANCELLED" and rec.states[-1] == "CANCELLED"
    assert_nothing_left()
    assert wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in loops), 15), "a loop outlived its job"
    [(addr, port)] = run.rendezvous
    assert wait_until(lambda: not listening(addr, port), 15), f"{addr}:{port} still open"


def test_checkpoints_are_kept_and_pruned(ray_cluster, tmp_path):
    summary = run_job(spec_of(**{"resources.workers": 2, "checkpoint.every_steps": 4, "checkpoint.keep": 2}),
                      tmp_path)
    steps = [s for s, _ in complete_checkpoints(Path(summary["job_dir"]))]
    assert steps == [16, 20]
    logs = Path(summary["job_dir"]) / "logs"
    assert "ready at step 0" in (logs / "rank-1.log").read_text()
    assert "state SUCCEEDED" in (logs / "supervisor.log").read_text()


def test_exported_model_reproduces_loss_and_seeds_a_new_job(ray_cluster, tmp_path):
    spec = spec_of(**{"resources.workers": 2})
    summary = run_job(spec, tmp_path, "first")
    state = load_file(summary["export_path"])
    assert state_sha256(state) == summary["params_sha256"]

    model = build_model(spec)
    model.load_state_dict(state)  # plain torch, no Trainyard runtime
    train_set, val_set = build_datasets(spec)
    sums = [validation_sums(model, val_set, spec, r, 2, max_batches=eval_batches_of(spec, train_set, val_set))
            for r in range(2)]
    reproduced = sum(t for t, _ in sums) / sum(c for _, c in sums)
    assert reproduced == pytest.approx(summary["final_val_loss"], rel=1e-6)

    # init_from: the new job's first loss is the exported model's loss on that job's first batch.
    follow = spec_of(**{"resources.workers": 2, "train.steps": 2, "train.init_from": summary["export_path"]})
    second = run_job(follow, tmp_path, "second")
    train_set, _ = build_datasets(follow)
    batch = GlobalBatches(train_set, 16, follow.train.seed)
    inputs, targets = zip(*[train_set[i] for i in batch.indices(0, 0, 16)])
    with torch.no_grad():
        expected = float(LOSSES["cross_entropy"](model(torch.stack(inputs)), torch.stack(targets)))
    assert second["initial_loss"] == pytest.approx(expected, rel=1e-5)
    assert second["initial_loss"] < summary["initial_loss"] - 0.5


def test_user_entrypoint_model_and_dataset_train(ray_cluster, tmp_path):
    spec = spec_of(
        model={"entrypoint": "tests.fixtures.user_code:make_model", "args": {"in_features": 4, "hidden": 16}},
        data={"entrypoint": "tests.fixtures.user_code:make_dataset", "args": {"n": 512}},
        **{"train.loss": "mse", "train.steps": 30, "train.lr": 0.02, "resources.workers": 2},
    )
    summary = run_job(spec, tmp_path)
    assert summary["state"] == "SUCCEEDED"
    assert summary["final_loss"] < 0.5 * summary["initial_loss"]


def test_workers_run_at_normal_priority(ray_cluster):
    """Ray starts its workers at nice 15, below every other process on the node; a rank preempted
    by the supervisor or Ray's daemons stalls its whole group (service/ray_client.worker_env)."""
    import os

    @ray_cluster.remote(num_cpus=0)
    def niceness() -> int:
        return os.nice(0)

    assert ray_cluster.get(niceness.remote()) == 0
