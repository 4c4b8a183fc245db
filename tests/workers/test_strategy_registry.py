"""The strategy registry: each layout selects its strategy from one ordered table, every strategy's
own rules are checked, and a new strategy is one file plus one registry line."""

from __future__ import annotations

import pytest

from tests.fixtures.extra_strategy import ECHO, EchoStrategy
from tests.helpers import spec_of
from workers.parallel import layouts, registry
from workers.parallel.data_parallel.replicate import ReplicateStep
from workers.parallel.planner import estimate
from workers.spec import SPEC_ERRORS, format_validation_error
from workers.spec_checks import checked_spec

LAYOUTS = [
    ({"resources.workers": 2}, "ddp"),
    ({"resources.workers": 2, "parallel.compression": {"kind": "fp16"}}, "ddp"),
    ({"resources.workers": 2, "parallel.local_sgd": {"period": 2}}, "local_sgd"),
    ({"resources.workers": 2, "parallel.zero": 1}, "zero"),
    ({"resources.workers": 2, "parallel.zero": 3}, "fsdp"),
    ({"resources.workers": 4, "parallel.zero": 3, "parallel.tp": 2}, "fsdp"),
    ({"resources.workers": 2, "parallel.tp": 2}, "tp"),
    ({"resources.workers": 2, "parallel.pp": 2}, "pipeline"),
    ({"resources.workers": 4, "parallel.pp": 2, "parallel.tp": 2}, "pipeline"),
    ({"resources.workers": 2, "parallel.sdp": {"coverage": 1.0}}, "sdp"),
]


# Plain data parallelism, dp x tp, ZeRO-1/2 and local SGD are one strategy, the replicate data-parallel step, under
# their layout names.
REPLICATED = ("ddp", "tp", "zero", "local_sgd")


@pytest.mark.parametrize(("overrides", "name"), LAYOUTS)
def test_each_layout_selects_its_strategy(overrides, name):
    spec = spec_of(**{"model.n_layers": 2, **overrides})
    assert layouts.strategy_name(spec) == name  # what `trainyard run --json` reports as layout.strategy
    expected = "replicate" if name in REPLICATED else name
    assert registry.strategy_class(spec).name == expected
    assert type(registry.build_strategy(spec)).name == expected


def test_ddp_tp_zero_and_local_sgd_run_the_replicate_step():
    assert {registry.STRATEGIES[name] for name in REPLICATED} == {ReplicateStep}
    assert [s for s in registry.STRATEGIES.values() if s.name in REPLICATED] == []  # no whole-layout classes left


def test_a_new_strategy_is_a_layout_and_a_strategy_with_a_line_in_each_table(monkeypatch):
    monkeypatch.setattr(layouts, "LAYOUTS", (ECHO, *layouts.LAYOUTS))  # its line: which specs, rule, cost
    monkeypatch.setattr(registry, "STRATEGIES", {**registry.STRATEGIES, "echo": EchoStrategy})  # and how it trains
    spec = spec_of(name="echo-job", **{"resources.workers": 2})
    assert registry.strategy_class(spec).name == "echo"
    assert isinstance(registry.build_strategy(spec), EchoStrategy)
    assert registry.strategy_class(spec_of(**{"resources.workers": 2})) is ReplicateStep  # others unchanged
    est = estimate(spec)  # its own cost
    assert est.strategy == "echo" and est.model_state_bytes_per_rank == 1 and est.comm_bytes_per_step == 2
    with pytest.raises(SPEC_ERRORS) as info:  # its own rule, refused by name like every other
        spec_of(name="echo-big", **{"resources.workers": 4})
    assert [e["field"] for e in format_validation_error(info.value)] == ["resources.workers"]


def test_a_parameter_server_job_is_its_own_layout_and_strategy():
    """Model 'dlrm' with parallel.parameter_server runs the parameter-server strategy and reports it as its
    layout.strategy (the dense part is DDP's, so its predicted cost is too); without the section it is ddp."""
    from service.supervisor.summary import layout_of
    from workers.parallel.parameter_server.strategy import ParameterServerStrategy

    dlrm = {"name": "dlrm", "model": {"name": "dlrm"}, "data": {"name": "synthetic:clicks"},
            "train": {"steps": 10, "global_batch_size": 32, "micro_batch_size": 8, "loss": "bce"},
            "resources": {"workers": 2}}
    plain = checked_spec(dlrm)
    ps = checked_spec({**dlrm, "parallel": {"parameter_server": {"shards": 2}}})
    assert layouts.strategy_name(ps) == layout_of(ps)["strategy"] == estimate(ps).strategy == "parameter_server"
    assert registry.strategy_class(ps) is ParameterServerStrategy
    assert isinstance(registry.build_strategy(ps), ParameterServerStrategy)
    assert layouts.strategy_name(plain) == layout_of(plain)["strategy"] == "ddp"
    assert estimate(ps).model_state_bytes_per_rank == estimate(plain).model_state_bytes_per_rank
