"""`trainyard validate` refuses a model whose predicted peak per worker cannot fit (exit 2, as for any refused
spec), against resources.memory_per_worker_gib or, without one, this host's memory (issue 46)."""

from __future__ import annotations

from tests.api.test_cli_run import trainyard, write_spec
from tests.helpers import tiny_spec

TERABYTE = tiny_spec(model={"name": "gpt", "n_layers": 256, "d_model": 16384, "n_heads": 128, "seq_len": 64},
                     **{"parallel.dp": 4, "parallel.zero": 3, "resources.workers": 4})


def test_validate_refuses_the_terabyte_model_and_a_spec_over_its_own_budget(tmp_path):
    out = trainyard(tmp_path, "validate", write_spec(tmp_path, "terabyte", TERABYTE))
    assert out.returncode == 2, out.stdout[-2000:]
    text = " ".join(out.stderr.split())
    assert "824.70 B parameters" in text and "per worker" in text and "this host's memory" in text, text

    # A stated budget is the check instead of this host: the tiny GPT's ~1.2 MiB peak is over 1 MiB.
    out = trainyard(tmp_path, "validate", write_spec(tmp_path, "tight",
                                                     tiny_spec(**{"resources.memory_per_worker_gib": 0.001})))
    assert out.returncode == 2
    assert "more than resources.memory_per_worker_gib (0.001 GiB)" in " ".join(out.stderr.split())
