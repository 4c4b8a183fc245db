"""workers/runtime/rank_process.py without Ray: the built-in loop in a child of the process that
would be the rank's actor, its events relayed, its requests passed on, and each side ending with
the other the way the supervisor expects."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest

from tests.helpers import spec_of, stat_fields, wait_until
from workers.events import RankStep
from workers.runtime.local_ranks import free_port
from workers.runtime.rank_process import RankProcess, RankStart
from workers.storage import Storage
from workers.training.control import RankControl


def start_of(tmp_path: Path, **overrides) -> RankStart:
    return RankStart(spec_of(**overrides), 0, 1, Storage.of(tmp_path / "job"), "127.0.0.1", free_port(), 60.0, None)


def test_the_loop_trains_in_a_child_and_its_steps_reach_the_actor(tmp_path):
    process = RankProcess(start_of(tmp_path, **{"train.steps": 4}))
    answer = process.ready()
    assert answer["start_step"] == 0 and answer["loop_pid"] != os.getpid()
    events = []
    result = process.run(events.append, RankControl())
    steps = [e.record["step"] for e in events if isinstance(e, RankStep)]
    assert steps == [1, 2, 3, 4]
    assert result["step"] == 4 and "params_sha256" in result
    process.terminate()
    assert wait_until(lambda: not _alive(answer["loop_pid"]), timeout_s=10)


def test_a_stop_request_reaches_the_loop_and_ends_it_at_a_checkpoint_step(tmp_path):
    process = RankProcess(start_of(tmp_path, **{"train.steps": 400, "checkpoint.every_steps": 2}))
    process.ready()
    events = []

    def emit(event):
        events.append(event)
        if isinstance(event, RankStep) and event.record["step"] == 3:
            process.request_stop()

    assert process.run(emit, RankControl()) == {"stopped_at": 4}  # the first checkpoint step after the request
    assert max(e.record["step"] for e in events if isinstance(e, RankStep)) == 4
    process.terminate()


def test_a_setup_error_is_raised_in_the_actor_with_its_own_type(tmp_path):
    """Its type decides whether the supervisor retries (workers/runtime/group.py): a bad entrypoint is not retried."""
    from workers.entrypoints import EntrypointError
    from workers.runtime.group import CONFIGURATION_ERRORS

    start = start_of(tmp_path, **{"model": {"entrypoint": "no_such_module_here:factory"}, "data.seq_len": 32})
    process = RankProcess(start)
    with pytest.raises(EntrypointError, match="model.entrypoint: cannot import module 'no_such_module_here'") as raised:
        process.ready()
    assert isinstance(raised.value, CONFIGURATION_ERRORS)
    process.terminate()


def _actor(tmp_path: Path, overrides: dict, pids) -> None:
    """What a rank actor does, in a process a test can watch die: set up, report the loop's pid, train."""
    process = RankProcess(start_of(tmp_path, **overrides))
    pids.put(process.ready()["loop_pid"])
    process.run(lambda event: None, RankControl())


def _actor_process(tmp_path: Path, overrides: dict):
    context = multiprocessing.get_context("spawn")
    pids = context.Queue()
    actor = context.Process(target=_actor, args=(tmp_path, overrides, pids))
    actor.start()
    return actor, pids.get(timeout=120)


def test_a_crash_in_the_loop_ends_the_actor_with_the_loops_exit_code(tmp_path):
    actor, _ = _actor_process(tmp_path, {"train.steps": 20,
                                         "fault_injection": [{"at_step": 3, "rank": 0, "kind": "crash"}]})
    actor.join(timeout=120)
    assert actor.exitcode == 17  # the injected crash's code: the supervisor sees the rank's process die


def test_the_loop_ends_when_its_actor_is_killed(tmp_path):
    actor, loop_pid = _actor_process(tmp_path, {"train.steps": 20,
                                                "fault_injection": [{"at_step": 2, "rank": 0, "kind": "hang"}]})
    assert _alive(loop_pid)
    os.kill(actor.pid, signal.SIGKILL)  # as ray.kill or a lost node would
    actor.join(timeout=30)
    started = time.monotonic()
    assert wait_until(lambda: not _alive(loop_pid), timeout_s=15), "the loop outlived its actor"
    assert time.monotonic() - started < 15


def _alive(pid: int) -> bool:
    fields = stat_fields(f"/proc/{pid}/stat")
    return fields is not None and fields[0] != "Z"
