"""The data-parallel step's options (workers/parallel/layouts/data_parallel_options.py): one frozen value per
checked spec, torch-free. Every example of the compatibility table gets the step kind its layout runs, the
group it reduces over and the options the spec sets."""

from __future__ import annotations

import pytest

from tests.workers.test_compatibility import ON, PAIRS, spec_with
from workers.parallel.layouts import layout_of, step_capabilities
from workers.parallel.layouts.compatibility import composes
from workers.parallel.layouts.data_parallel_options import DataParallelOptions
from workers.spec_loading import parse_spec

# The step kinds each layout runs: tp and the pipeline's stages replicate, as plain DDP does (a pipeline's stages
# shard under zero 3).
KINDS_OF_LAYOUT = {"ddp": {"replicate"}, "tp": {"replicate"}, "pipeline": {"replicate", "fsdp"},
                   "zero": {"zero1", "zero2"}, "fsdp": {"fsdp"}, "local_sgd": {"local_sgd"}, "sdp": {"sdp"}}
# The table's examples that submit accepts: each feature alone and every pair that composes.
EXAMPLES = [(), *((f,) for f in ON if f != "rebalance"),
            *((a, b) for a, b in PAIRS if "rebalance" not in (a, b) and composes(a, b))]


def _checked(*features: str):
    return parse_spec(spec_with(*features), allow_fault_injection=True)


@pytest.mark.parametrize("features", EXAMPLES, ids=["+".join(f) or "plain" for f in EXAMPLES])
def test_every_example_gets_the_kind_its_layout_runs(features):
    spec = _checked(*features)
    options = DataParallelOptions.of(spec)
    assert options.kind in KINDS_OF_LAYOUT[layout_of(spec).name], (features, options.kind)
    assert options.capabilities == step_capabilities(spec)
    assert options == DataParallelOptions.of(spec)  # a value: the same spec, the same options


@pytest.mark.parametrize(("feature", "kind", "group"), [
    ("zero1", "zero1", ("dp_cp",)), ("zero2", "zero2", ("dp_cp",)), ("fsdp", "fsdp", ("dp_cp",)),
    ("hsdp", "fsdp", ("dp_replicate", "dp_shard_cp")), ("tp", "replicate", ("dp_cp",)),
    ("cp", "replicate", ("dp_cp",)), ("compression", "replicate", ("dp_cp",)),
    ("local_sgd", "local_sgd", ("dp_cp",)), ("sdp", "sdp", ("dp_cp",)), ("pp", "replicate", ("dp_cp",)),
])
def test_each_feature_names_its_kind_and_group(feature, kind, group):
    options = DataParallelOptions.of(parse_spec(spec_with(feature), allow_fault_injection=True))
    assert (options.kind, options.group) == (kind, group)


def test_the_options_carry_what_the_spec_sets():
    compressed = DataParallelOptions.of(parse_spec(spec_with("compression", "mixed_precision")))
    assert compressed.compression is not None and compressed.compression.kind == "fp16"
    assert compressed.mixed_precision == "bf16" and compressed.local_sgd_period is None
    assert DataParallelOptions.of(parse_spec(spec_with("local_sgd"))).local_sgd_period == 2
    data = spec_with("zero2")
    data["parallel"]["offload_optimizer"] = True
    assert DataParallelOptions.of(parse_spec(data)).offload_optimizer is True
    data = spec_with("fsdp")
    data["parallel"].update(reshard_after_forward=False, fsdp_accumulate="unsharded")
    kept = DataParallelOptions.of(parse_spec(data))
    assert (kept.reshard_after_forward, kept.fsdp_accumulate, kept.offload_optimizer) == (False, "unsharded", False)
    sdp = DataParallelOptions.of(parse_spec(spec_with("sdp")))
    assert sdp.sdp is not None and sdp.sdp.coverage == 0.75


def test_uneven_shares_only_where_one_reduction_per_step_weights_every_rank():
    uneven = {f for f in ON if f != "rebalance" and DataParallelOptions.of(_checked(f)).capabilities.uneven_shares}
    assert uneven == {"zero1", "compression", "activation_checkpointing", "mixed_precision", "compile", "hierarchical"}
