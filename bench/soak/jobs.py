"""The job mix: one small spec per layout, and the seeded choice of which job carries a rank fault.

Every kind has one fixed spec (fixed seed), so every job of a kind trains the same problem and ends
with the same `params_sha256`: any fault-free job of the kind is a chaos-hit job's twin."""

from __future__ import annotations

import copy
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

STEPS = 40
RANK_FAULTS = ("crash", "hang", "slow")
# The example script reports no compute time of its own, so its ranks' times between reports include the
# wait for the slowest one at every collective: a slow rank cannot be told from its peers there
# (workers/program/reports.py), and a `slow` fault on it would count as missed whatever the service did.
PROGRAM_RANK_FAULTS = ("crash", "hang")
HANG_TIMEOUT_S = 15.0  # a hung rank is noticed this long after its last step

BASE = {
    "model": {"name": "gpt", "n_layers": 2, "d_model": 32, "n_heads": 2, "seq_len": 32},
    "data": {"name": "text:pystdlib", "max_bytes": 200_000},
    "train": {"steps": STEPS, "global_batch_size": 16, "micro_batch_size": 4, "lr": 3e-3, "warmup_steps": 2,
              "seed": 0},
    "resources": {"workers": 2, "cpus_per_worker": 1},
    "checkpoint": {"every_steps": 5, "keep": 2},
    "fault_tolerance": {"max_restarts": 6, "hang_timeout_s": HANG_TIMEOUT_S},
}

LAYOUTS: dict[str, dict] = {
    "ddp": {"parallel": {"dp": 2}},
    "fsdp": {"parallel": {"dp": 2, "zero": 3}},
    "tp-dp": {"parallel": {"dp": 2, "tp": 2}, "resources": {"workers": 4, "cpus_per_worker": 1}},
    "pp-dp": {"parallel": {"dp": 2, "pp": 2}, "resources": {"workers": 4, "cpus_per_worker": 1}},
    "sdp": {"parallel": {"dp": 2, "sdp": {"mode": "neuron", "coverage": 0.75}}},
    "elastic": {"parallel": {"dp": 2}, "resources": {"workers": 2, "min_workers": 1, "cpus_per_worker": 1}},
}
KINDS = (*LAYOUTS, "program")


def program_spec(code_dir: str) -> dict:
    """examples/torchrun-script, unmodified, as a `program: {command}` job; its hash is its final.sha256."""
    return {"program": {"command": ["python", "train.py", "--steps", str(STEPS), "--checkpoint-every", "5"],
                        "working_dir": code_dir},
            "resources": {"workers": 2, "cpus_per_worker": 1},
            "fault_tolerance": {"max_restarts": 6, "hang_timeout_s": HANG_TIMEOUT_S}}


def install_program(storage: Path) -> str:
    """The example script where the service's storage holds it (a working_dir a tenant may name)."""
    src = Path(__file__).resolve().parents[2] / "examples" / "torchrun-script"
    dest = storage / "code-src" / "torchrun-script"
    if not dest.exists():
        shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", "checkpoints"))
    return str(dest)


@dataclass(frozen=True)
class JobPlan:
    kind: str
    name: str
    fault: dict | None  # one fault_injection entry, or None: the job runs clean unless the cluster is hit

    def spec(self, code_dir: str) -> dict:
        if self.kind == "program":
            spec = program_spec(code_dir)
        else:
            spec = copy.deepcopy(BASE)
            for section, value in LAYOUTS[self.kind].items():
                spec[section] = {**spec.get(section, {}), **value}
        spec["name"] = self.name
        if self.fault:
            spec["fault_injection"] = [self.fault]
        return spec


def rank_fault(rng: random.Random, workers: int, program: bool = False) -> dict:
    kind = rng.choice(PROGRAM_RANK_FAULTS if program else RANK_FAULTS)
    # a slow rank needs a straggler window (8 steps) of slow steps after it to be detected
    last = STEPS - 12 if kind == "slow" else STEPS - 3
    fault = {"kind": kind, "rank": rng.randrange(workers), "at_step": rng.randint(6, last)}
    return {**fault, "factor": 4.0} if kind == "slow" else fault


def plan_stream(rng: random.Random, count: int, fault_share: float) -> list[JobPlan]:
    """`count` jobs cycling through every kind in a shuffled order; a share carry a rank fault."""
    plans = []
    for i in range(count):
        if i % len(KINDS) == 0:
            order = list(KINDS)
            rng.shuffle(order)
        kind = order[i % len(KINDS)]
        workers = LAYOUTS.get(kind, {}).get("resources", {}).get("workers", 2)
        fault = rank_fault(rng, workers, kind == "program") if rng.random() < fault_share else None
        plans.append(JobPlan(kind, f"soak-{i:04d}-{kind}", fault))
    return plans


def twin_of(plan: JobPlan, index: int) -> JobPlan:
    return JobPlan(plan.kind, f"twin-{index:04d}-{plan.kind}", None)
