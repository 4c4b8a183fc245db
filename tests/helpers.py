"""Small test helpers: spec building and Ray leak checks."""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path

import ray

from workers.spec_loading import parse_spec

TINY_GPT = {
    "name": "tiny",
    "model": {"name": "gpt", "n_layers": 1, "d_model": 32, "n_heads": 2, "seq_len": 32},
    "data": {"name": "text:pystdlib", "max_bytes": 200_000},
    "train": {"steps": 20, "global_batch_size": 16, "micro_batch_size": 4, "lr": 3e-3, "warmup_steps": 2},
    "resources": {"workers": 1},
}


def with_overrides(base: dict, overrides: dict) -> dict:
    """A deep copy of `base` with dotted-key overrides, e.g. {"resources.workers": 2}."""
    data = copy.deepcopy(base)
    for key, value in overrides.items():
        node = data
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return data


def tiny_spec(**overrides):
    """TINY_GPT with dotted-key overrides, e.g. tiny_spec(**{"resources.workers": 2})."""
    return with_overrides(TINY_GPT, overrides)


def spec_of(**overrides):
    return parse_spec(tiny_spec(**overrides), allow_fault_injection=True)


def alive_actors() -> list[dict]:
    return [a for a in ray._private.state.actors().values() if a["State"] != "DEAD"]


def live_placement_groups() -> list[dict]:
    return [p for p in ray.util.placement_group_table().values() if p["state"] != "REMOVED"]


def wait_until(predicate, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.5)
    return False


class Events:
    """A RunListener that records what a JobRun reports: (kind, data) events and step records."""

    def __init__(self):
        self.states, self.events, self.steps = [], [], []

    def on_state(self, state, message):
        self.states.append(str(state))

    def on_event(self, event):
        self.events.append((event.kind, event.data()))

    def on_step(self, record):
        self.steps.append(record)


def train(spec, job_dir):
    """Train a spec to its end with a JobRun on the session's Ray; (summary, step records)."""
    from service.supervisor.run import JobRun

    rec = Events()
    summary = JobRun(spec, job_dir, job_dir.name, listener=rec).run()
    assert summary["state"] == "SUCCEEDED", summary["error"]
    return summary, rec.steps


class TrainedOnce:
    """Layouts trained once each, on first use (each test stays within the per-test timeout):
    `runs[key]` trains `spec_for(*key)` (a tuple key) or `spec_for(key)` in its own job directory."""

    def __init__(self, root, spec_for):
        self.root, self.spec_for, self.done = root, spec_for, {}

    def __getitem__(self, key):
        if key not in self.done:
            args = key if isinstance(key, tuple) else (key,)
            self.done[key] = train(self.spec_for(*args), self.root / "-".join(args))
        return self.done[key]


def rank_loop_processes() -> dict[int, int]:
    """{training-loop pid: its rank actor's pid} on this host (workers/runtime/rank_process.py): a loop
    is forked from its actor, so it is a TrainWorker process whose parent is one too."""
    def is_worker(pid: int) -> bool:
        try:
            return b"TrainWorker" in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False

    loops = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and is_worker(int(entry)):
            parent = process_parent(int(entry))
            if parent and is_worker(parent):
                loops[int(entry)] = parent
    return loops


def stat_fields(path: str | Path) -> list[str] | None:
    """The fields of a /proc stat file after the command name (state first), or None once it
    is gone. The name may hold spaces and parentheses, hence the split after the last ')'."""
    try:
        stat = Path(path).read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()


def process_parent(pid: int) -> int | None:
    fields = stat_fields(f"/proc/{pid}/stat")
    return None if fields is None else int(fields[1])


def thread_niceness(pid: int) -> dict[int, int]:
    """{thread id: its niceness} of a live process (/proc/<pid>/task/<tid>/stat, field 19)."""
    nice = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        fields = stat_fields(f"/proc/{pid}/task/{tid}/stat")
        if fields is not None:  # else the thread ended
            nice[int(tid)] = int(fields[16])
    return nice


def thread_names(pid: int) -> set[str]:
    names = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            names.add(Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip())
        except OSError:
            pass  # the thread ended
    return names
