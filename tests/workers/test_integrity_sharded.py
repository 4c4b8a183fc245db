"""The integrity check on sharded layouts with replicas, end to end on a real Ray with 4 gloo workers:
one flipped bit on one rank of an SDP job (each block held by several workers) and of an HSDP job
(dp_replicate 2 x dp_shard 2) is caught before the next forward by that rank's own checksums
(workers/training/shard_integrity.py, which name it alone), the job restores the last checkpoint, and
its final state is bit-identical to a run without the fault (as test_integrity.py shows for DDP)."""

from __future__ import annotations

import pytest

from service.supervisor.run import JobRun
from tests.helpers import Events, alive_actors, spec_of

pytestmark = pytest.mark.slow

BASE = {"resources.workers": 4, "model.n_layers": 4, "model.n_heads": 2, "train.steps": 12,
        "checkpoint.every_steps": 5, "fault_tolerance.integrity_check_every": 5, "data.max_bytes": 50_000}
LAYOUTS = {
    "sdp": ({"parallel.sdp": {"mode": "block", "coverage": 0.75}}, "corrupted ranks: [1]"),
    # the replica comparison alone would name rank 3 too (two replicas, no majority)
    "hsdp": ({"parallel.zero": 3, "parallel.dp_shard": 2}, "corrupted ranks: [1]"),
}


def run(tmp_path, name: str, job: str, faults=()) -> tuple[dict, Events]:
    rec = Events()
    spec = spec_of(**{**BASE, **LAYOUTS[name][0]}, fault_injection=list(faults))
    return JobRun(spec, tmp_path / job, job, rec).run(), rec


@pytest.mark.timeout(900)
# make test-all (HSDP ~40 s, SDP ~2-4 min); make test catches a flipped bit on a DDP replica (test_integrity).
@pytest.mark.parametrize("name", [pytest.param("hsdp", marks=pytest.mark.exhaustive),
                                  pytest.param("sdp", marks=pytest.mark.exhaustive)])
def test_a_flipped_bit_on_a_sharded_replica_is_caught_and_restored(ray_cluster, tmp_path, name):
    clean, _ = run(tmp_path, name, "clean")
    assert clean["state"] == "SUCCEEDED", clean["error"]
    summary, rec = run(tmp_path, name, "bitflip", [{"at_step": 7, "rank": 1, "kind": "bitflip"}])
    assert summary["state"] == "SUCCEEDED" and summary["restarts"] == 1, summary.get("error")
    [restart] = [d for k, d in rec.events if k == "restart"]
    assert restart["cause"] == "corruption" and LAYOUTS[name][1] in restart["reason"], restart
    assert restart["resume_step"] == 5  # the corrupted state of step 10 was never checkpointed
    assert summary["params_sha256"] == clean["params_sha256"]  # restored, then trained as without the fault
    assert alive_actors() == []
