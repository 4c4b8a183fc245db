"""A new user's common spec mistakes through the CLI (issue 52): each is refused on stderr with a line
a person can act on (the file, line and column of a syntax error; the dotted field, the rule and the
value given; the closest valid key) and exit 2, never a traceback; a valid spec gets a one-line verdict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import tiny_spec
from tests.user_models import LLAMA_SPEC


def trainyard(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """The CLI as a user runs it; TRAINYARD_URL names a port nothing listens on, so a command that
    contacted the service would fail with 'cannot reach the service' (exit 1), not refuse the spec."""
    env = {**os.environ, "TRAINYARD_HOME": str(tmp_path / "home"), "TRAINYARD_URL": "http://127.0.0.1:1",
           "TRAINYARD_RAY_ADDRESS": "", "COLUMNS": "80"}
    env.pop("TRAINYARD_ALLOW_FAULT_INJECTION", None)
    return subprocess.run([sys.executable, "-m", "api.cli", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def refused(out: subprocess.CompletedProcess) -> list[str]:
    """The problem lines of a refusal (exit 2, no traceback), each whole on one line."""
    assert out.returncode == 2, (out.returncode, out.stdout[-2000:], out.stderr[-2000:])
    assert "Traceback" not in out.stderr and out.stdout == "", out.stderr
    return [line for line in out.stderr.splitlines() if line.startswith(("invalid spec ", "cannot read spec "))]


YAML_ERROR = "name: x\ntrain:\n  steps: 3\n lr: 0.1\n"  # line 4 is indented one space less than its section
TAB = "name: x\ntrain:\n\tsteps: 3\n"


# --- the eight mistakes --------------------------------------------------------------------------

def test_a_yaml_syntax_error_is_one_line_with_file_line_and_column(tmp_path):
    path = write(tmp_path, "spec.yaml", YAML_ERROR)
    [line] = refused(trainyard(tmp_path, "validate", path))
    assert f"{path}, line 4, column 2: invalid YAML: expected <block end>" in line, line
    assert "indentation" in line


def test_b_a_tab_character_is_named(tmp_path):
    path = write(tmp_path, "tab.yaml", TAB)
    [line] = refused(trainyard(tmp_path, "validate", path))
    assert f"{path}, line 3, column 1: invalid YAML: expected spaces, found a tab character" in line, line


def test_c_a_json_syntax_error_in_a_json_spec(tmp_path):
    path = write(tmp_path, "spec.json", '{"name": "x",\n "train": {"steps": 3,}}\n')
    [line] = refused(trainyard(tmp_path, "validate", path))
    assert f"{path}, line 2, column 23: invalid JSON: expecting property name enclosed in double quotes" in line


def test_d_a_key_typo_gets_did_you_mean(tmp_path):
    path = write(tmp_path, "typo.yaml", yaml.safe_dump(tiny_spec(**{"train.micro_batchsize": 4})))
    lines = refused(trainyard(tmp_path, "validate", path))
    assert lines == ["invalid spec train.micro_batchsize: is not a key of train; "
                     "did you mean train.micro_batch_size?"], lines


def test_e_a_negative_learning_rate_repeats_the_value(tmp_path):
    path = write(tmp_path, "lr.yaml", yaml.safe_dump(tiny_spec(**{"train.lr": -1})))
    assert refused(trainyard(tmp_path, "validate", path)) == ["invalid spec train.lr: must be greater than 0 (got -1)"]


def test_f_an_unknown_model_name_repeats_the_value(tmp_path):
    path = write(tmp_path, "gpt2.yaml", yaml.safe_dump(tiny_spec(**{"model.name": "gpt2"})))
    [line] = refused(trainyard(tmp_path, "validate", path))
    assert line.startswith("invalid spec model.name must be 'gpt', 'mlp' or 'dlrm'") and line.endswith("(got 'gpt2')"), line


def test_g_an_hf_model_without_data_seq_len_speaks_the_spec_s_words(tmp_path):
    path = write(tmp_path, "hf.yaml", yaml.safe_dump({**LLAMA_SPEC, "data": {"name": "text:pystdlib"}}))
    [line] = refused(trainyard(tmp_path, "validate", path))
    assert line.startswith("invalid spec data.seq_len is required with model.hf"), line
    assert "(data.seq_len is not set)" in line
    assert "HFModelSpec" not in line and "model=" not in line


def test_h_field_and_cross_field_errors_are_reported_together(tmp_path):
    spec = tiny_spec(**{"train.lr": -1, "parallel.dp": 3, "resources.workers": 2})
    lines = refused(trainyard(tmp_path, "validate", write(tmp_path, "both.yaml", yaml.safe_dump(spec))))
    assert lines == ["invalid spec train.lr: must be greater than 0 (got -1)",
                     "invalid spec parallel: dp x tp x pp must equal resources.workers "
                     "(dp=3 x tp=1 x pp=1 = 3, workers=2)"], lines


# --- every command that reads a spec -------------------------------------------------------------

@pytest.mark.parametrize("text, where", [(YAML_ERROR, "line 4, column 2: invalid YAML: expected <block end>"),
                                         (TAB, "line 3, column 1: invalid YAML: expected spaces, found a tab")],
                         ids=["yaml", "tab"])
@pytest.mark.parametrize("command", ["validate", "run", "plan", "submit"])
def test_each_command_refuses_a_syntax_error_in_one_line(tmp_path, command, text, where):
    """`submit` refuses it before it contacts the service (which nothing here answers)."""
    path = write(tmp_path, "spec.yaml", text)
    [line] = refused(trainyard(tmp_path, command, path))
    assert line == f"cannot read spec {path}, {where}" or line.startswith(f"cannot read spec {path}, {where}"), line


def test_a_missing_file_and_a_list_are_refused_in_one_line(tmp_path):
    [line] = refused(trainyard(tmp_path, "submit", str(tmp_path / "absent.yaml")))
    assert "absent.yaml: cannot be read (No such file or directory)" in line
    [line] = refused(trainyard(tmp_path, "validate", write(tmp_path, "list.yaml", "- name: x\n")))
    assert "list.yaml: a job spec must be a mapping of keys" in line and "got list" in line


# --- a valid spec ---------------------------------------------------------------------------------

def test_validate_prints_a_one_line_verdict(tmp_path):
    path = write(tmp_path, "ok.yaml", yaml.safe_dump(tiny_spec(**{"resources.workers": 2})))
    out = trainyard(tmp_path, "validate", path)
    assert out.returncode == 0, out.stderr[-2000:]
    [line] = out.stdout.splitlines()
    assert line.startswith(f"{path}: valid: dp2 (ddp), 2 workers, predicted peak ") and line.endswith(" MiB per worker")


def test_validate_names_a_3d_layout_and_prints_the_resolved_spec_only_with_json(tmp_path):
    example = str(Path(__file__).resolve().parents[2] / "examples" / "hf-llama-3d.yaml")
    out = trainyard(tmp_path, "validate", example)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith(f"{example}: valid: pp2 x tp2 x dp2 (pipeline), 8 workers, predicted peak ")
    as_json = trainyard(tmp_path, "validate", example, "--json")
    assert as_json.returncode == 0, as_json.stderr[-2000:]
    spec = json.loads(as_json.stdout)
    assert (spec["parallel"]["pp"], spec["parallel"]["tp"], spec["parallel"]["dp"]) == (2, 2, 2)
    assert spec["train"]["lr"] > 0  # defaults are filled in
