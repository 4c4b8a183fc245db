"""The pieces of program jobs that need no cluster: the spec's rules, the session API outside
Trainyard, which checkpoints are complete, how an exit is classified, the rank environment."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from service.supervisor.policies.sizing import relayout
from service.supervisor.program_steps import ProgramStepJoiner
from trainyard.checkpoints import complete_checkpoints_in, latest_checkpoint_in
from workers.program.environment import RankPlace, Rendezvous, rank_environment
from workers.program.errors import ProgramUnfixable, exit_failure
from workers.runtime.group import _first_failure
from workers.spec import SPEC_ERRORS, JobSpec, format_validation_error
from workers.spec_loading import parse_spec
from workers.storage import Storage


def program_spec(**overrides) -> dict:
    return {"name": "p", "resources": {"workers": 2}, "program": {"command": ["python", "train.py"]}, **overrides}


def test_a_program_spec_round_trips_without_the_trainer_sections():
    spec = parse_spec(program_spec())
    stored = spec.model_dump(mode="json")
    assert not {"model", "data", "train"} & set(stored)
    assert parse_spec(stored) == spec  # a stored program spec passes its own rules again
    assert spec.total_steps == 0


@pytest.mark.parametrize("overrides, field", [
    ({"program": {"command": ["a"], "function": "m:f"}}, "program.command"),
    ({"program": {"command": ["a"], "config": {"x": 1}}}, "program.config"),
    ({"parallel": {"tp": 2}}, "parallel"),
    ({"program": {"function": "m:f"}, "parallel": {"dp": 1, "pp": 2}}, "parallel"),
    ({"fault_injection": [{"at_step": 1, "kind": "nan"}]}, "fault_injection[0].kind"),
    ({"fault_injection": [{"at_step": 1, "kind": "crash", "during": "final_validation"}]}, "fault_injection[0].during"),
    ({"program": {"command": ["a"], "env": {"TRAINYARD_JOB_ID": "x"}}}, "program.env"),
    ({"program": {"function": "m:f"}, "parallel": "auto"}, "parallel"),
])
def test_program_rules_name_the_field(overrides, field, monkeypatch):
    monkeypatch.setenv("TRAINYARD_ALLOW_FAULT_INJECTION", "1")
    with pytest.raises(SPEC_ERRORS) as info:
        parse_spec(program_spec(**overrides))
    assert field in str(info.value)


def test_only_a_train_function_takes_several_gpus_per_rank():
    with pytest.raises(SPEC_ERRORS) as info:
        parse_spec(program_spec(resources={"workers": 2, "gpus_per_worker": 2}))
    errors = {e["field"]: e["message"] for e in format_validation_error(info.value)}
    assert "program.command (torchrun-style)" in errors["resources.gpus_per_worker"], errors
    spec = parse_spec(program_spec(resources={"workers": 2, "gpus_per_worker": 2}, program={"function": "m:f"}))
    assert spec.resources.gpus_per_worker == 2
    assert parse_spec(program_spec(resources={"workers": 2, "gpus_per_worker": 0.5})).resources.gpus_per_worker == 0.5


def test_session_api_outside_trainyard_is_harmless(tmp_path):
    code = ("import trainyard; trainyard.report({'loss': 1.0}); assert trainyard.should_stop() is False; "
            "print(trainyard.rank(), trainyard.world_size(), trainyard.checkpoint_dir(), trainyard.latest_checkpoint())")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINYARD_", "RANK", "WORLD_SIZE"))}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "1", "checkpoints", "None"]


def test_only_complete_checkpoints_count(tmp_path):
    (tmp_path / "step-5.pt").write_bytes(b"x")
    (tmp_path / "step-20.pt.tmp").write_bytes(b"half")
    (tmp_path / "step-10").mkdir()  # a DCP directory still being written: no .metadata yet
    (tmp_path / "step-8").mkdir()
    (tmp_path / "step-8" / ".metadata").write_bytes(b"m")
    (tmp_path / "final.sha256").write_text("abc")  # a step-less name
    assert [s for s, _ in complete_checkpoints_in(tmp_path)] == [5, 8]
    (tmp_path / "step-10" / "COMPLETE").touch()
    assert latest_checkpoint_in(tmp_path) == tmp_path / "step-10"


def test_the_session_api_finds_complete_checkpoints_on_an_object_store(s3_server):
    """A program's TRAINYARD_CHECKPOINT_DIR is a URI when the job's storage is an object store."""
    root = Storage.at(s3_server.create_bucket("program-ckpts") + "/jobs/p/checkpoints")
    root.write_bytes("step-10/.metadata", b"m")
    root.write_bytes("step-20/__0_0.distcp", b"x")  # no .metadata yet: still being written
    root.write_bytes("epoch_3.pt", b"x")
    root.write_bytes(".step-30.tmp", b"x")
    assert complete_checkpoints_in(root.uri) == [(3, root.url("epoch_3.pt")), (10, root.url("step-10"))]
    assert latest_checkpoint_in(root.uri) == root.url("step-10")
    assert complete_checkpoints_in(root.url("absent")) == []


@pytest.mark.parametrize("code, tail, unfixable", [
    (2, ["usage: train.py", "train.py: error: unrecognized arguments: --x"], True),
    (1, ["Traceback ...", "ModuleNotFoundError: No module named 'nope'"], True),
    (1, ["Traceback ...", "RuntimeError: Connection reset by peer"], False),
    (-9, [], False),
])
def test_exit_classification(code, tail, unfixable):
    failure = exit_failure(1, "python", code, tail)
    assert isinstance(failure, ProgramUnfixable) is unfixable
    assert failure.retryable is not unfixable
    assert str(failure).startswith("rank 1: python ")


def test_the_rank_killed_from_outside_is_named_though_a_peers_end_was_seen_first():
    killed = exit_failure(1, "python", -9, [], exited_at=100.5)  # the OOM killer, or an injected crash
    peer = exit_failure(0, "python", 1, ["RuntimeError: Connection closed by peer"], exited_at=100.2)
    later = exit_failure(2, "python", -6, [], exited_at=100.3)  # an abort is the program's own reaction
    shipped = pickle.loads(pickle.dumps(killed))  # as Ray carries it to the group
    assert (shipped.killed, shipped.failed_at) == (True, 100.5)
    failures = [(0, SimpleNamespace(cause=peer)), (1, SimpleNamespace(cause=shipped)),
                (2, SimpleNamespace(cause=later))]
    assert min(failures, key=_first_failure)[0] == 1
    assert min(failures[::2], key=_first_failure)[0] == 0  # otherwise the end seen first


def test_rank_environment_is_torchruns():
    spec = parse_spec(program_spec(resources={"workers": 3}))
    place = RankPlace.of(2, ["n1", "n2", "n2"])
    env = rank_environment(spec, Path("/s/jobs/j1"), place, Rendezvous("10.0.0.1", 29500), 1, "/tmp/s")
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                                "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID",
                                "TRAINYARD_TRIAL", "TRAINYARD_CHECKPOINT_DIR")} == {
        "RANK": "2", "LOCAL_RANK": "1", "WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
        "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RESTART_COUNT": "1",
        "TORCHELASTIC_RUN_ID": "j1", "TRAINYARD_TRIAL": "1", "TRAINYARD_CHECKPOINT_DIR": "/s/jobs/j1/checkpoints"}
    assert "TORCHELASTIC_USE_AGENT_STORE" not in env  # rank 0's program hosts the store
    agent = rank_environment(spec, Path("/s/jobs/j1"), place, Rendezvous("10.0.0.1", 29500, True), 1, None)
    assert agent["TORCHELASTIC_USE_AGENT_STORE"] == "True"  # rank 0's actor hosts it, as torchrun's agent
    assert "TRAINYARD_REPORT_EVERY_S" not in env  # reports travel in batches (trainyard/channel.py)
    faulty = parse_spec(program_spec(fault_injection=[{"at_step": 3, "rank": 0, "kind": "crash"}]),
                        allow_fault_injection=True)
    faulty_env = rank_environment(faulty, Path("/s/jobs/j1"), place, Rendezvous("10.0.0.1", 29500), 1, "/tmp/s")
    assert faulty_env["TRAINYARD_REPORT_EVERY_S"] == "0"  # each sent at once: the fault acts at its step


def test_every_rank_sees_its_nodes_gpus_in_local_rank_order():
    nodes, gpus = ["a", "b", "a", "b"], [["3"], ["0"], ["1"], ["2"]]
    assert [RankPlace.of(r, nodes, gpus).node_devices for r in range(4)] == ["3,1", "0,2", "3,1", "0,2"]
    assert RankPlace.of(2, nodes, gpus).local_rank == 1  # cuda:1 of "3,1" is this rank's own GPU 1
    assert RankPlace.of(0, nodes).node_devices is None  # CPU: no CUDA_VISIBLE_DEVICES is set


def test_an_elastic_program_shrinks_its_world_and_its_mesh():
    command = parse_spec(program_spec(resources={"workers": 4, "min_workers": 2}))
    assert relayout(command, 3).world_size == 3
    function = parse_spec(program_spec(program={"function": "m:f"}, parallel={"dp": 2, "tp": 2},
                                       resources={"workers": 4, "min_workers": 2}))
    smaller = relayout(function, 2)
    assert (smaller.world_size, smaller.dp, smaller.parallel.tp) == (2, 1, 2)
    assert relayout(function, 3) is None  # tp 2 does not divide 3 workers


def test_program_steps_take_rank_zeros_values_and_every_ranks_time():
    joiner = ProgramStepJoiner(2)
    base = {"step": 3, "comm_time_s": 0.0, "samples": 0, "ts": 1.0, "grad_norm": None, "lr": None}
    assert joiner.add({**base, "rank": 1, "loss": 9.0, "step_time_s": 0.5, "compute_time_s": 0.4,
                       "samples_per_s": 1.0, "metrics": {"acc": 0.1}}) is None
    joined = joiner.add({**base, "rank": 0, "loss": 2.0, "step_time_s": 0.2, "compute_time_s": 0.1,
                         "samples_per_s": 50.0, "metrics": {"acc": 0.9}})
    assert (joined["loss"], joined["samples_per_s"], joined["metrics"], joined["step_time_s"]) == (2.0, 50.0,
                                                                                                  {"acc": 0.9}, 0.5)
    assert [r["compute_time_s"] for r in joined["ranks"]] == [0.1, 0.4]
    assert isinstance(JobSpec.model_validate(parse_spec(program_spec()).model_dump()), JobSpec)


def test_the_session_socket_batches_reports_and_a_rank_that_goes_mid_exchange_is_no_error(monkeypatch):
    import socket
    import struct
    import threading

    from trainyard import channel
    from trainyard.channel import SocketSession
    from workers.program.session_server import SessionServer

    class Sink:
        def __init__(self):
            self.seen: list = []

        def report(self, metrics, step, wall_s=None, own_s=None):
            self.seen.append((step, wall_s, own_s))

    errors: list = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))
    monkeypatch.setattr(channel, "STOP_FRESH_S", 0.05)
    stop, sink = threading.Event(), Sink()
    server = SessionServer(sink, stop)  # type: ignore[arg-type]
    try:
        session = SocketSession(server.path)
        session.report({"loss": 1.5}, 3)  # the first report is sent at once
        assert session.should_stop() is False  # its answer, read: the first call has no fresh one
        stop.set()
        session.report({"loss": 1.25}, 4)
        session.report({"loss": 1.0}, 5)
        assert session.should_stop() is False  # fresh enough: no round trip
        assert [s for s, _, _ in sink.seen] == [3]  # 4 and 5 wait for their line, sent when due
        deadline = time.monotonic() + 5
        while len(sink.seen) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [s for s, _, _ in sink.seen] == [3, 4, 5]
        assert all(wall >= 0 and own >= 0 for _, wall, own in sink.seen)  # the rank's own timing travels
        time.sleep(0.1)
        assert session.should_stop() is True  # stale: the sent line's answer is read, and it says stop
        # A process's last reports, still waiting at its exit, are sent as it ends.
        subprocess.run([sys.executable, "-c", "import sys; from trainyard.channel import SocketSession; "
                        "s = SocketSession(sys.argv[1]); [s.report({'loss': 1.0}, i) for i in (10, 11, 12)]",
                        server.path], check=True, timeout=60, cwd=str(Path(__file__).resolve().parents[2]))
        deadline = time.monotonic() + 5
        while len(sink.seen) < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [s for s, _, _ in sink.seen][3:] == [10, 11, 12]
        gone = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        gone.connect(server.path)
        line = b'{"op": "report", "reports": [{"metrics": {}, "step": 1, "wall_s": 0, "own_s": 0}]}\n'
        gone.sendall(line * 2000)  # answers it will never read
        gone.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        gone.close()  # reset: the server's next write fails
        deadline = time.monotonic() + 5
        while len(sink.seen) < 2006 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        assert errors == [], errors
    finally:
        server.close()


def test_a_supervisor_gone_while_reports_wait_fails_the_ranks_next_call(tmp_path):
    """The sending thread's failure is not lost: the rank's next report raises it (its process then
    exits non-zero and the group's end says why), rather than reporting into nothing."""
    import json
    import socket

    from trainyard.channel import SocketSession

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "s"))
    listener.listen(1)
    session = SocketSession(str(tmp_path / "s"))
    conn, _ = listener.accept()
    session.report({"loss": 2.0}, 1)  # sent at once
    with conn.makefile("rwb") as stream:
        assert json.loads(stream.readline())["reports"][0]["step"] == 1
        stream.write(b'{"stop": false}\n')
        stream.flush()
    conn.close()  # the supervisor's side goes away
    session.report({"loss": 1.9}, 2)  # waits for its line: the sending thread sends it when due
    time.sleep(0.5)
    with pytest.raises(ConnectionError):
        session.report({"loss": 1.8}, 3)
    listener.close()


def test_trainyard_run_reaches_a_programs_first_step_without_importing_torch():
    # The CLI is the supervisor under `trainyard run`: torch and every strategy cost it ~3 s before
    # its ranks start (bench/programs.py), and a program's supervisor needs neither.
    code = ("import sys; from pathlib import Path\n"
            "from api.cli.local import read_spec_or_exit\n"
            "from service.supervisor.run import JobRun\n"
            "from service.supervisor.summary import layout_of\n"
            "from workers.parallel.pipeline.summary import pipeline_summary\n"
            "spec = read_spec_or_exit(Path('examples/torchrun-script/spec.yaml'))\n"
            "assert layout_of(spec)['strategy'] == 'program' and pipeline_summary(spec, []) is None\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]", out.stdout
