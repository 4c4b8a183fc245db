"""bench/overhead.py: Trainyard's CPU beyond the training loop, read from /proc over the steady window.

The accounting on hand-built readings (who is counted where, once), the reading of this process's own
threads, and (exhaustive) the whole bench on a short real job through `trainyard serve`."""

from __future__ import annotations

import os
import threading
import time

import pytest

from bench.cpu_accounting import (
    CONTROL_PLANE,
    LOOP,
    RANK_ACTOR,
    RAY,
    SUPERVISOR,
    Proc,
    Snapshot,
    account,
    classify,
    read_proc,
    steady_window,
)
from workers.os_thread_name import name_os_thread

SERVE, GCS, RAYLET, IDLE, SUP, ACTOR0, ACTOR1, LOOP0, LOOP1 = 100, 101, 102, 110, 111, 112, 113, 120, 121
LOOPS = {LOOP0: 0, LOOP1: 1}


def _procs(scale: float, extra: dict[int, Proc] | None = None) -> dict[int, Proc]:
    """A job's tree where every counter is `scale` times a fixed amount."""
    def p(pid, ppid, title, threads):
        return Proc(pid, ppid, title, {tid: (name, cpu * scale) for tid, (name, cpu) in threads.items()})

    procs = {
        SERVE: p(SERVE, 1, "python -m api.cli serve", {SERVE: ("python", 0.5), 1001: ("python", 0.25)}),
        GCS: p(GCS, SERVE, "/venv/site-packages/ray/core/src/ray/gcs/gcs_server --a", {GCS: ("gcs_server", 1.0)}),
        RAYLET: p(RAYLET, SERVE, "/venv/site-packages/ray/core/src/ray/raylet/raylet --b",
                  {RAYLET: ("raylet", 2.0)}),
        IDLE: p(IDLE, RAYLET, "ray::IDLE", {IDLE: ("ray::IDLE", 0.5)}),
        SUP: p(SUP, RAYLET, "ray::JobSupervisor.drain", {SUP: ("ray::JobSupervi", 0.25), 1101: ("ty-jobrun", 0.5)}),
        ACTOR0: p(ACTOR0, RAYLET, "ray::TrainWorker.poll_node",
                  {ACTOR0: ("ray::TrainWork", 0.5), 1201: ("grpc", 0.25)}),
        ACTOR1: p(ACTOR1, RAYLET, "ray::TrainWorker.train", {ACTOR1: ("ray::TrainWork", 0.75)}),
        # the training processes keep their actor's title (forked)
        LOOP0: p(LOOP0, ACTOR0, "ray::TrainWorker.setup",
                 {LOOP0: ("ray::TrainWork", 40.0), 1301: ("gloo_tcp_loop", 2.0), 1302: ("ty-rank-request", 0.125)}),
        LOOP1: p(LOOP1, ACTOR1, "ray::TrainWorker.setup",
                 {LOOP1: ("ray::TrainWork", 38.0), 1311: ("gloo_tcp_loop", 4.0)}),
    }
    return {**procs, **(extra or {})}


def test_every_process_has_one_role_and_ray_is_apart():
    roles = classify(_procs(1.0), SERVE, LOOPS)
    assert {pid: role for pid, (role, _) in roles.items()} == {
        SERVE: CONTROL_PLANE, GCS: RAY, RAYLET: RAY, IDLE: RAY, SUP: SUPERVISOR,
        ACTOR0: RANK_ACTOR, ACTOR1: RANK_ACTOR, LOOP0: LOOP, LOOP1: LOOP}
    assert roles[ACTOR1][1] == "rank 1 actor" and roles[LOOP0][1] == "rank 0 training process"


def test_the_fraction_is_trainyards_cpu_beyond_the_loop_over_the_loops():
    snaps = [Snapshot(10.0, _procs(1.0)), Snapshot(11.0, _procs(1.5)), Snapshot(12.0, _procs(2.0))]
    acc = account(snaps, 0, 2, steps=10, serve_pid=SERVE, loop_ranks=LOOPS)
    by_pid = {r.pid: r for r in acc.rows}
    assert sorted(by_pid) == sorted(_procs(1.0))  # each process once
    # the window doubles every counter: each delta is the fixed amount
    assert by_pid[LOOP0].loop_s == pytest.approx(42.0) and by_pid[LOOP0].trainyard_s == pytest.approx(0.125)
    assert by_pid[LOOP1].loop_s == pytest.approx(42.0) and by_pid[LOOP1].trainyard_s == 0
    assert acc.loop_s == pytest.approx(84.0)
    trainyard = 0.75 + 0.75 + 0.75 + 0.75 + 0.125  # serve, supervisor, two actors, a loop's named thread
    assert acc.trainyard_s == pytest.approx(trainyard)
    assert acc.ray_s == pytest.approx(3.5)  # gcs, raylet, the idle worker: not in the figure
    assert acc.fraction == pytest.approx(trainyard / 84.0)
    assert acc.per_step_ms(acc.loop_s) == pytest.approx(8400.0)
    assert sum(sum(sum(v) for v in r.threads.values()) for r in acc.rows) == pytest.approx(
        acc.loop_s + acc.trainyard_s + acc.ray_s)


def test_a_process_started_in_the_window_counts_from_zero_and_a_gone_one_to_its_last_reading():
    late = Proc(130, SERVE, "python -m workers.parallel.pipeline.unit_costs_apart", {130: ("python", 0.5)})
    first = _procs(1.0)
    middle = _procs(1.5, {130: late})
    end = {pid: p for pid, p in _procs(2.0).items() if pid != SUP}  # the supervisor's last reading was `middle`
    acc = account([Snapshot(0, first), Snapshot(1, middle), Snapshot(2, end)], 0, 2, 5, SERVE, LOOPS)
    by_pid = {r.pid: r for r in acc.rows}
    assert by_pid[130].trainyard_s == pytest.approx(0.5)
    assert by_pid[SUP].trainyard_s == pytest.approx(0.375)


def test_the_window_runs_between_readings_inside_the_steady_steps():
    snaps = [Snapshot(t, {}) for t in (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0)]
    step_ts = {s: 0.3 + 0.5 * s for s in range(1, 13)}  # step s finished at 0.3 + s/2
    i_a, i_b, steps = steady_window(snaps, step_ts, warmup=2, steps=8)  # step 2 at 1.3, step 10 at 5.3
    assert (i_a, i_b) == (2, 5)
    assert steps == 6  # steps 4..9 finished in (2.0, 5.0]
    with pytest.raises(ValueError, match="no step"):
        steady_window(snaps, step_ts, warmup=2, steps=20)


def test_no_window_is_an_error():
    with pytest.raises(ValueError, match="no steady window"):
        account([Snapshot(0, {})], 0, 0, 1, SERVE, {})


def test_this_process_is_read_with_its_named_threads_cpu():
    burned, done = threading.Event(), threading.Event()

    def burn():
        name_os_thread("burner")
        end = time.thread_time() + 0.2
        while time.thread_time() < end:
            pass
        burned.set()
        done.wait(10)  # alive while it is read

    thread = threading.Thread(target=burn, daemon=True)
    thread.start()
    assert burned.wait(30)
    proc = read_proc(os.getpid())
    done.set()
    thread.join()
    assert proc is not None and proc.pid == os.getpid()
    name, cpu = proc.threads[thread.native_id]
    assert name == "ty-burner"
    assert cpu >= 0.1  # burned 0.2 s of its own CPU (counted in ticks of 10 ms)


@pytest.mark.slow
@pytest.mark.exhaustive
def test_the_bench_accounts_a_short_real_job(tmp_path):
    from bench.overhead import measure

    acc, job = measure(warmup=3, steps=10, workers=2, interval_s=0.25, work=tmp_path, idle_s=2.0)
    roles = [r.role for r in acc.rows]
    assert len({r.pid for r in acc.rows}) == len(acc.rows)  # every process counted once
    assert roles.count(LOOP) == 2 and roles.count(RANK_ACTOR) == 2
    assert roles.count(SUPERVISOR) == 1 and roles.count(CONTROL_PLANE) == 1
    assert sorted(r.label for r in acc.rows if r.role == RANK_ACTOR) == ["rank 0 actor", "rank 1 actor"]
    assert 8 <= acc.steps <= 11
    for r in acc.rows:
        assert r.cpu_s == pytest.approx(sum(sum(v) for v in r.threads.values()))
        assert r.loop_s == 0 or r.role == LOOP
    loops = [r for r in acc.rows if r.role == LOOP]
    assert all(r.loop_s > 0 for r in loops)
    assert all(r.threads["training thread (main)"][0] > 0.5 * r.loop_s for r in loops)  # the loop's own thread
    trainyard = sum(r.cpu_s - r.loop_s for r in acc.rows if r.role != RAY)
    assert trainyard > 0  # the actors and the supervisor take some CPU
    assert acc.fraction == pytest.approx(trainyard / sum(r.loop_s for r in loops))
    assert acc.ray_s > 0
    assert job["serve_idle_cpu_per_s"] is not None and job["serve_idle_cpu_per_s"] >= 0
