"""The spec rules of model 'dlrm', data 'synthetic:clicks', train.loss 'bce' and parallel.parameter_server:
each refusal names the field and the rule, and checking imports no torch."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest

from workers.spec import SpecError
from workers.spec_checks import checked_spec

DLRM = {
    "name": "dlrm",
    "model": {"name": "dlrm"},
    "data": {"name": "synthetic:clicks"},
    "train": {"steps": 10, "global_batch_size": 32, "micro_batch_size": 8, "loss": "bce"},
    "resources": {"workers": 2},
}


def spec(**overrides):
    data = copy.deepcopy(DLRM)
    for key, value in overrides.items():
        node = data
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return data


def refusals(data) -> dict[str, str]:
    with pytest.raises(SpecError) as caught:
        checked_spec(data)
    found: dict[str, str] = {}
    for v in caught.value.violations:  # one field may break two rules: both messages
        found[v.field] = f"{found[v.field]} | {v.message}" if v.field in found else v.message
    return found


def test_a_parameter_server_spec_is_accepted_for_dlrm():
    checked = checked_spec(spec(**{"parallel.parameter_server": {"shards": 3, "mode": "bounded", "staleness": 2}}))
    assert checked.parallel.parameter_server.staleness == 2


def test_dlrm_on_clicks_with_bce_is_accepted_and_the_data_takes_the_models_shape():
    from workers.spec import clicks_shape

    checked = checked_spec(spec(**{"model.table_sizes": [10, 20], "model.dense_features": 3}))
    assert clicks_shape(checked.data, checked.model) == (3, [10, 20])


CASES = [
    ({"data": {"name": "text:pystdlib"}}, "data.name", ["model 'dlrm' needs click data", "'text:pystdlib'"]),
    ({"train.loss": "mse"}, "train.loss", ["must be 'bce' for model 'dlrm'"]),
    ({"model": {"name": "gpt"}, "data": {"name": "text:pystdlib"}}, "train.loss",
     ["'bce' needs a model with one logit per sample", "model 'gpt'"]),
    ({"model": {"name": "mlp", "out_features": 2}, "data": {"name": "synthetic", "out_features": 2}},
     "train.loss", ["out_features=2"]),
    ({"model": {"name": "mlp"}}, "data.name", ["'synthetic:clicks' gives (dense, sparse ids)"]),
    ({"data.table_sizes": [5, 5]}, "data.table_sizes", ["must equal model.table_sizes"]),
    ({"data.dense_features": 3}, "data.dense_features", ["must equal model.dense_features"]),
    ({"model.table_sizes": [1]}, "model.table_sizes[0]", ["greater than or equal to 2"]),
    ({"parallel.pp": 2}, "parallel.pp", ["must be 1 for model 'dlrm'"]),
    ({"parallel.parameter_server": {"shards": 0}}, "parallel.parameter_server.shards", ["greater than or equal to 1"]),
    ({"parallel.parameter_server": {"shards": 2, "staleness": 2}}, "parallel.parameter_server.staleness",
     ["applies to mode 'bounded' only"]),
    ({"parallel.parameter_server": {"shards": 2, "mode": "bounded"}}, "parallel.parameter_server.staleness",
     ["is required with mode 'bounded'"]),
    ({"parallel.parameter_server": {"shards": 2, "mode": "bounded", "staleness": -1}},
     "parallel.parameter_server.staleness", ["greater than or equal to 0"]),
    ({"model": {"name": "gpt"}, "data": {"name": "text:pystdlib"}, "train.loss": "cross_entropy",
      "parallel.parameter_server": {"shards": 2}}, "parallel.parameter_server", ["needs a model with embedding"]),
    ({"parallel.parameter_server": {"shards": 2}, "parallel.zero": 3}, "parallel.parameter_server",
     ["not with zero 3"]),
    ({"parallel.parameter_server": {"shards": 2}, "parallel.local_sgd": {"period": 2}}, "parallel.parameter_server",
     ["combines only with plain data parallelism", "not with local_sgd"]),
    # async trainers never meet after their set-up: nothing that needs them to agree on a step
    ({"parallel.parameter_server": {"shards": 2, "mode": "async"}, "fault_tolerance.loss_spike": {"factor": 3.0}},
     "fault_tolerance.loss_spike", ["mode 'async'", "a collective"]),
    ({"parallel.parameter_server": {"shards": 2, "mode": "async"}, "fault_tolerance.integrity_check_every": 5},
     "fault_tolerance.integrity_check_every", ["mode 'async'", "compares replicas"]),
]


@pytest.mark.parametrize(("keys", "field", "words"), CASES, ids=[f"{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_a_bad_recommendation_spec_names_the_field_and_the_rule(keys, field, words):
    errors = refusals(spec(**keys))
    assert field in errors, errors
    assert all(w in errors[field] for w in words), errors[field]


def test_checking_a_recommendation_spec_imports_no_torch():
    code = ("import sys; from workers.spec_checks import checked_spec; from tests.workers.test_recommendation_spec "
            "import DLRM; checked_spec(DLRM); assert 'torch' not in sys.modules, 'torch imported'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
