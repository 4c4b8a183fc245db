"""The data-parallel step's kinds (workers/parallel/data_parallel/): the registry builds the replicate or the shard
step from a spec's DataParallelOptions, and a pipeline's stages reduce through the replicate step's reducer.
In-process, no process group: what is built, not how it trains (tests/workers/test_strategies.py and
tests/workers/test_pipeline.py check the losses)."""

from __future__ import annotations

import pytest
from torch import nn

from tests.helpers import spec_of
from workers.parallel import registry
from workers.parallel.data_parallel.reducers import DDPReducer, StageAllReduce, reducer_for
from workers.parallel.data_parallel.replicate import ReplicateStep
from workers.parallel.data_parallel.shard import ShardStep
from workers.parallel.layouts import strategy_name
from workers.parallel.layouts.data_parallel_options import DataParallelOptions

SHARDED = [
    ({"resources.workers": 2, "parallel.zero": 3}, ("dp_cp",)),
    ({"resources.workers": 4, "parallel.zero": 3, "parallel.dp_shard": 2}, ("dp_replicate", "dp_shard_cp")),
    ({"resources.workers": 4, "parallel.zero": 3, "parallel.tp": 2}, ("dp_cp",)),
]


@pytest.mark.parametrize(("overrides", "group"), SHARDED, ids=["fsdp", "hsdp", "fsdp_x_tp"])
def test_zero3_builds_the_shard_step_with_its_options(overrides, group):
    spec = spec_of(**{"model.n_layers": 2, **overrides})
    step = registry.build_strategy(spec)
    assert isinstance(step, ShardStep) and registry.strategy_class(spec) is ShardStep
    assert step.options == DataParallelOptions.of(spec) and step.options.kind == "fsdp"
    assert step.options.group == group
    assert strategy_name(spec) == step.name == "fsdp"  # layout.strategy: fsdp, HSDP included


@pytest.mark.parametrize("overrides", [{}, {"parallel.zero": 1}, {"parallel.tp": 2},
                                       {"parallel.local_sgd": {"period": 2}}], ids=["ddp", "zero1", "tp", "local_sgd"])
def test_the_other_kinds_build_the_replicate_step(overrides):
    spec = spec_of(**{"resources.workers": 2, **overrides})
    step = registry.build_strategy(spec)
    assert isinstance(step, ReplicateStep) and step.options == DataParallelOptions.of(spec)


def test_a_pipeline_stage_reduces_through_the_replicate_steps_reducer():
    spec = spec_of(**{"model.n_layers": 4, "resources.workers": 4, "parallel.pp": 2})
    options = DataParallelOptions.of(spec)
    assert options.kind == "replicate" and options.dims.pp == 2
    assert isinstance(reducer_for(nn.Linear(2, 2), options), StageAllReduce)
    chimera_group = object()  # a group the pipeline names: it reduces over that one
    assert reducer_for(nn.Linear(2, 2), options, chimera_group).group is chimera_group
    plain = DataParallelOptions.of(spec_of(**{"resources.workers": 2}))
    assert isinstance(reducer_for(nn.Linear(2, 2), plain), DDPReducer)  # without stages: DDP, as before


def test_a_pipeline_with_zero3_shards_its_stages_with_gpipe_and_1f1b_only():
    """pp x FSDP2: the pipeline layout, its step's kind "fsdp"; other schedules, ZeRO-1/2, HSDP and tp/cp with it
    are refused naming the field."""
    from workers.spec import SPEC_ERRORS, format_validation_error

    keys = {"model.n_layers": 4, "resources.workers": 4, "parallel.pp": 2, "parallel.zero": 3}
    for schedule in ("1f1b", "gpipe"):
        spec = spec_of(**keys, **{"parallel.pipeline": {"schedule": schedule}})
        assert strategy_name(spec) == "pipeline" and DataParallelOptions.of(spec).kind == "fsdp"
    refused = [({"parallel.pipeline": {"schedule": "interleaved_1f1b"}}, "parallel.pipeline.schedule"),
               ({"parallel.pipeline": {"schedule": "chimera"}}, "parallel.pipeline.schedule"),
               ({"parallel.zero": 2}, "parallel.zero"),
               ({"parallel.dp_shard": 1}, "parallel.dp_shard"),
               ({"parallel.tp": 2, "resources.workers": 8}, "parallel.tp")]
    for extra, field in refused:
        with pytest.raises(SPEC_ERRORS) as info:
            spec_of(**{**keys, **extra})
        assert field in {e["field"] for e in format_validation_error(info.value)}, (extra, info.value)
