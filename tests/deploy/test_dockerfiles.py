"""The images (deploy/*.Dockerfile), read without a Docker engine: the versions agree with
pyproject.toml, the builds are multi-stage, and the final stage runs as a non-root user
without compilers."""

from __future__ import annotations

import re
import tomllib

import pytest

from tests.deploy.chart import ROOT
from tests.deploy.dockerfile import parse

DOCKERFILES = sorted((ROOT / "deploy").glob("*.Dockerfile"))
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
BUILD_TOOLS = re.compile(r"\b(build-essential|gcc|g\+\+|clang|make|cmake|git|cargo|rustc|python3?-dev)\b")


def pinned(package: str) -> str:
    (spec,) = [d for d in PROJECT["dependencies"] if re.match(rf"{package}(\[|=)", d)]
    return spec.split("==")[1]


def test_the_three_images_exist():
    assert [p.name for p in DOCKERFILES] == ["control-plane.Dockerfile", "ray-cuda.Dockerfile", "ray.Dockerfile"]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_versions_agree_with_pyproject(path):
    df = parse(path)
    assert df.args["RAY_VERSION"] == pinned("ray")
    assert df.args["TORCH_VERSION"] == pinned("torch")
    python = df.args["PYTHON_VERSION"]
    assert f">={python}" in PROJECT["requires-python"], (python, PROJECT["requires-python"])
    assert all(s.base.startswith(f"python:{python}-") for s in df.stages)
    installs = " ".join(" ".join(s.args_of("RUN")) for s in df.stages)
    # The pins are used, not just declared.
    assert re.search(r'"ray\[[a-z,]+\]==\$\{RAY_VERSION\}"', installs), installs
    assert '"torch==${TORCH_VERSION}"' in installs
    assert "pip install ." in installs  # the project itself, with its pinned dependencies


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_multi_stage_and_non_root_without_build_tools(path):
    df = parse(path)
    assert len(df.stages) >= 2, "build in one stage, run in another"
    final = df.final
    assert any(arg.startswith("--from=") for arg in final.args_of("COPY")), "the final stage copies the build"
    assert not final.args_of("ADD")
    for run in final.args_of("RUN"):
        assert "pip install" not in run, "install in the build stage"
        for install in re.findall(r"apt-get install[^&;]*", run):
            assert not BUILD_TOOLS.search(install), f"build tools in the final image: {install}"
    (user,) = final.args_of("USER")[-1:]
    uid = user.split(":")[0]
    assert uid not in ("root", "0") and uid.isdigit(), f"final USER must be a numeric non-root uid: {user}"
    assert uid == "1000"  # the chart's securityContext runAsUser (templates/_helpers.tpl)


def test_control_plane_image_serves_on_the_chart_port():
    final = parse(ROOT / "deploy" / "control-plane.Dockerfile").final
    assert final.args_of("ENTRYPOINT") == ['["trainyard"]'] and final.args_of("CMD") == ['["serve"]']
    assert final.args_of("EXPOSE") == ["8600"]
    env = " ".join(final.args_of("ENV"))
    assert "TRAINYARD_HOST=0.0.0.0" in env and "TRAINYARD_PORT=8600" in env


def test_cuda_image_asks_the_runtime_for_the_driver():
    env = " ".join(parse(ROOT / "deploy" / "ray-cuda.Dockerfile").final.args_of("ENV"))
    assert "NVIDIA_VISIBLE_DEVICES=all" in env and "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in env


def test_parser_sees_a_root_user_and_compilers(tmp_path):
    """The checks above can fail."""
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text("ARG RAY_VERSION=1\nFROM python:3.11-slim\nRUN apt-get install -y \\\n    gcc make\nUSER root\n")
    df = parse(bad)
    assert len(df.stages) == 1 and df.final.args_of("USER") == ["root"]
    assert BUILD_TOOLS.search(df.final.args_of("RUN")[0])
