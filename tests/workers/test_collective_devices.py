"""Every collective of every strategy goes where the rule says (workers/parallel/control_group.py):
data on the rank's device through a data group, host values on the CPU through a control group.

Two real gloo processes (no Ray) train each strategy's tiny job for 4 steps under a collective
recorder (workers/parallel/collective_audit.py), with a checkpoint, the replica check, the loss-spike
agreement and the export in the run, so every kind of collective is issued. On CPU the devices
cannot differ; the declared sites can: a host value sent to a data group from the training loop or
from a control site is a violation here as it is an NCCL error on a GPU (the last test shows that).
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import spec_of
from workers.models import build_model
from workers.parallel.collective_audit import CONTROL, DATA, SITES, Collective, violations
from workers.runtime.local_ranks import run_jobs

COMMON = {"resources.workers": 2, "train.steps": 4, "checkpoint.every_steps": 2,
          "fault_tolerance.loss_spike": {"factor": 10.0}, "model.n_heads": 4, "model.n_layers": 2}
CHECKED = {"fault_tolerance.integrity_check_every": 2}  # layouts with replicas: digests compared
STRATEGIES = {
    "ddp": CHECKED,
    "zero1": {"parallel.zero": 1, **CHECKED},
    "zero2": {"parallel.zero": 2, **CHECKED},
    "fsdp": {"parallel.zero": 3},
    "tp": {"parallel.tp": 2},
    "pipeline": {"parallel.pp": 2},
    "sdp": {"parallel.sdp": {"mode": "neuron", "coverage": 0.75}, **CHECKED},
    "fp16_compression": {"parallel.compression": {"kind": "fp16"}, **CHECKED},
    # all-gathers packed signs; every rank decodes every message alike (the replica check agrees)
    "onebit_compression": {"parallel.compression": {"kind": "onebit"}, **CHECKED},
    "local_sgd": {"parallel.local_sgd": {"period": 2}, **CHECKED},
}


@pytest.fixture(scope="module")
def audited(tmp_path_factory) -> dict[str, list[dict]]:
    jobs = [(name, spec_of(**{**COMMON, **extra})) for name, extra in STRATEGIES.items()]
    return run_jobs(jobs, world=2, job_dir=str(tmp_path_factory.mktemp("audit")), audit=True, timeout_s=300)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_every_collective_uses_its_declared_group_and_device(audited, strategy):
    for rank, result in enumerate(audited[strategy]):
        assert result.get("state") == "SUCCEEDED", (rank, result.get("trace", result))
        assert result["violations"] == [], (rank, result["violations"])
        kinds = {SITES[site] for site, _ in result["sites"]}
        assert kinds == {DATA, CONTROL}, (rank, result["sites"])  # both kinds were exercised


def test_a_host_value_on_a_data_group_is_a_violation_on_cpu():
    """The check can fail on CPU: the pipeline's makespan all-gather, sent to the pp data group as it
    once was, is a collective from an undeclared site on a data group; a control site's collective
    that lands on a data group is named as such; a data collective off the device is named too."""
    cpu, control_groups = torch.device("cpu"), {"ctl"}
    makespan = Collective("c10d.allgather_", "pp-data", ("cpu",),
                          "workers.parallel.pipeline.strategy:PipelineStrategy._pipeline_loss_and_makespan")
    assert "undeclared site" in violations([makespan], cpu, control_groups)[0]
    agree = Collective("c10d.allreduce_", "world-data", ("cpu",), "workers.parallel.control_group:ControlGroups.all_reduce")
    assert "went through the data group" in violations([agree], cpu, control_groups)[0]
    grads = Collective("c10d.allreduce_", "world-data", ("cpu",), "workers.parallel.common:average_in_place")
    assert violations([grads], cpu, control_groups) == []
    assert "not cuda" in violations([grads], torch.device("cuda"), control_groups)[0]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "tp", "pipeline"])
def test_every_rank_reports_the_whole_models_size_for_mfu(audited, strategy):
    """MFU counts 6 x parameters x tokens/s for any model: the ranks count the model they built, before a
    strategy shards it (a pipeline stage or a TP shard holds only part of it)."""
    whole = sum(p.numel() for p in build_model(spec_of(**{**COMMON, **STRATEGIES[strategy]})).parameters())
    for result in audited[strategy]:
        assert {r["model_params"] for r in result["records"]} == {whole}
