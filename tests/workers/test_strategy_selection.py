"""The torch-free strategy name (workers/parallel/selection.py, for the supervisor and the API) is the
name of the strategy the registry builds, for every layout the registry tells apart."""

from __future__ import annotations

import pytest

from tests.helpers import spec_of
from workers.parallel.registry import REGISTRY, strategy_class
from workers.parallel.selection import SELECTION, strategy_name

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
]


def test_the_selection_names_the_registrys_strategies_in_its_order():
    assert [name for name, _ in SELECTION] == [s.name for s in REGISTRY]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: ",".join(f"{k}={v}" for k, v in layout.items()) or "ddp")
def test_the_torch_free_name_is_the_registrys_choice(layout):
    spec = spec_of(**{"resources.workers": 2, **layout})
    assert strategy_name(spec) == strategy_class(spec).name


def test_every_strategy_is_chosen_by_some_layout():
    chosen = {strategy_name(spec_of(**{"resources.workers": 2, **layout})) for layout in LAYOUTS}
    assert chosen == {s.name for s in REGISTRY}
