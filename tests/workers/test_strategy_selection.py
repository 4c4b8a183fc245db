"""The torch-free layouts (workers/parallel/layouts/: which layout runs a spec, for the supervisor and the
API) and the strategies the registry builds: every layout name has its strategy (ddp and tp share the
replicate data-parallel step), and every strategy runs some layout."""

from __future__ import annotations

import pytest

from tests.helpers import spec_of
from workers.parallel.layouts import LAYOUTS as ORDER
from workers.parallel.layouts import strategy_name
from workers.parallel.registry import REGISTRY, STRATEGIES, strategy_class

LAYOUTS = [
    {},
    {"parallel.pp": 2, "model.n_layers": 4},
    {"parallel.pp": 2, "parallel.tp": 2, "model.n_layers": 4, "resources.workers": 4},
    {"parallel.zero": 3},
    {"parallel.zero": 1},
    {"parallel.zero": 2},
    {"parallel.tp": 2},
    {"parallel.tp": 2, "parallel.zero": 3, "resources.workers": 4},
    {"parallel.local_sgd": {"period": 4}},
    {"parallel.sdp": {}},
    {"parallel.parameter_server": {"shards": 2}, "model": {"name": "dlrm"}, "data": {"name": "synthetic:clicks"},
     "train.loss": "bce"},
]


def test_every_layout_has_its_strategy_and_every_strategy_its_layout():
    assert sorted(layout.name for layout in ORDER) == sorted(STRATEGIES)
    assert set(STRATEGIES.values()) == set(REGISTRY)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: ",".join(f"{k}={v}" for k, v in layout.items()) or "ddp")
def test_the_torch_free_name_is_the_registrys_choice(layout):
    spec = spec_of(**{"resources.workers": 2, **layout})
    assert strategy_class(spec) is STRATEGIES[strategy_name(spec)]


def test_every_strategy_is_chosen_by_some_layout():
    chosen = {strategy_name(spec_of(**{"resources.workers": 2, **layout})) for layout in LAYOUTS}
    assert chosen == set(STRATEGIES)
    assert {STRATEGIES[name] for name in chosen} == set(REGISTRY)
