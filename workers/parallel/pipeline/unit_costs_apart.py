"""A pipeline's unit costs for a process that must not import torch (the supervisor).

The cost model (costs.py) builds the spec's model on torch's meta device. A supervisor needs the
costs twice per job at most (the summary's split, a measured re-split), so it asks a short-lived
child process for them and keeps the answer: the child's torch (~250 MiB) is gone when it exits,
while an import in the supervisor would stay for the job's whole run. A process that already
holds torch (a rank, a test) computes them itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from workers.spec import JobSpec, sequence_length

CHILD_TIMEOUT_S = 300.0  # a user model's constructor runs there too (on meta; on CPU if meta fails)
_COSTS: dict[tuple[str, int], tuple[float, ...]] = {}


class CostModelFailed(RuntimeError):
    """The child process could not estimate the costs (its error is in the message)."""


def unit_costs_apart(spec: JobSpec) -> list[float]:
    """Estimated forward FLOPs per sequence of [embedding, block 0..L-1, head], as costs.unit_costs."""
    if "torch" in sys.modules:  # already paid for here: no child
        from workers.parallel.pipeline.costs import unit_costs

        return unit_costs(spec)
    key = (json.dumps(spec.model.model_dump(mode="json"), sort_keys=True), sequence_length(spec) or 1)
    if key not in _COSTS:
        _COSTS[key] = tuple(_from_child(spec))
    return list(_COSTS[key])


def _from_child(spec: JobSpec) -> list[float]:
    # The child finds what this process imports (a user model's module too) on the same path.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, "-m", "workers.parallel.pipeline.costs"],
                          input=spec.model_dump_json(), capture_output=True, text=True, env=env,
                          timeout=CHILD_TIMEOUT_S)
    if done.returncode != 0:
        raise CostModelFailed(f"pipeline cost model failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return [float(c) for c in json.loads(done.stdout.strip().splitlines()[-1])]
