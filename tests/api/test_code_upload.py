"""api/cli/code_upload.py without a server: the zip of a working_dir is the same bytes for the same
files, leaves out caches and git, stops at the limit, and unpacks on a worker to the same tree;
`trainyard run` takes a relative working_dir from the spec file's directory."""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import zipfile
from pathlib import Path

import pytest

from api.cli.code_upload import WorkingDirError, local_working_dir, with_working_dir, zip_dir
from api.cli.local import with_absolute_working_dir
from workers.program.working_dir import archive_problem, materialize
from workers.spec_loading import parse_spec


def project(root: Path) -> Path:
    src = root / "src"
    for d in ("pkg/__pycache__", ".git/objects", "data"):
        (src / d).mkdir(parents=True)
    (src / "train.py").write_text("print('train')\n")
    (src / "run.sh").write_text("#!/bin/sh\n")
    (src / "run.sh").chmod(0o755)
    (src / "pkg" / "__init__.py").write_text("")
    (src / "pkg" / "model.py").write_text("X = 1\n")
    (src / "pkg" / "model.pyc").write_bytes(b"\0")
    (src / "pkg" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    (src / ".git" / "objects" / "ab").write_bytes(b"\0")
    (src / "data" / "tokens.bin").write_bytes(bytes(range(256)) * 8)
    return src


def zipped(directory: Path, max_bytes: int = 10**7) -> bytes:
    buf = io.BytesIO()
    zip_dir(directory, buf, max_bytes)
    return buf.getvalue()


def test_the_zip_is_deterministic_sorted_and_leaves_out_caches_and_git(tmp_path):
    src = project(tmp_path)
    first = zipped(src)
    for path in src.rglob("*"):
        os.utime(path, (1_700_000_000, 1_700_000_000))  # other timestamps: the same bytes
    assert zipped(src) == first
    with zipfile.ZipFile(io.BytesIO(first)) as zf:
        assert zf.namelist() == ["data/tokens.bin", "pkg/__init__.py", "pkg/model.py", "run.sh", "train.py"]
        assert {i.date_time for i in zf.infolist()} == {(1980, 1, 1, 0, 0, 0)}
        assert archive_problem(zf) is None  # what the service and the workers require
    (src / "pkg" / "model.py").write_text("X = 2\n")
    assert zipped(src) != first


def test_a_zip_over_the_limit_is_refused_naming_the_setting(tmp_path):
    src = project(tmp_path)
    (src / "big.bin").write_bytes(os.urandom(50_000))
    with pytest.raises(WorkingDirError, match="more than 20000 bytes.*TRAINYARD_MAX_CODE_BYTES"):
        zipped(src, max_bytes=20_000)
    with pytest.raises(WorkingDirError, match="is not a directory"):
        zipped(tmp_path / "absent")


def test_a_cli_zip_unpacks_on_a_worker_to_the_same_tree(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "node"))
    (tmp_path / "node").mkdir()
    src = project(tmp_path)
    data = zipped(src)
    sha = hashlib.sha256(data).hexdigest()
    (tmp_path / "storage" / "code").mkdir(parents=True)
    (tmp_path / "storage" / "code" / f"{sha}.zip").write_bytes(data)
    out = materialize(f"code:{sha}", tmp_path / "storage")

    def tree(root: Path) -> dict[str, bytes]:
        return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}

    shipped = {k: v for k, v in tree(src).items()
               if not (k.startswith(".git/") or "__pycache__" in k or k.endswith(".pyc"))}
    assert tree(out) == shipped
    assert (out / "run.sh").stat().st_mode & 0o100


def test_which_working_dir_is_local(tmp_path):
    spec = {"name": "p", "program": {"command": ["python", "t.py"], "working_dir": "src"}}
    assert local_working_dir(spec, tmp_path) == tmp_path / "src"
    assert local_working_dir(with_working_dir(spec, "/abs/dir"), tmp_path) == Path("/abs/dir")
    assert local_working_dir(with_working_dir(spec, "code:" + "a" * 64), tmp_path) is None
    assert local_working_dir({"name": "p"}, tmp_path) is None
    assert with_working_dir(spec, "x")["program"]["working_dir"] == "x" and spec["program"]["working_dir"] == "src"


def test_run_takes_a_relative_working_dir_from_the_spec_files_directory(tmp_path):
    def spec(working_dir):
        return parse_spec({"name": "p", "program": {"command": ["python", "t.py"], "working_dir": working_dir},
                           "resources": {"workers": 1}})

    assert with_absolute_working_dir(spec("src"), tmp_path).program.working_dir == str(tmp_path / "src")
    assert with_absolute_working_dir(spec("/opt/code"), tmp_path).program.working_dir == "/opt/code"
    ref = "code:" + "b" * 64
    assert with_absolute_working_dir(spec(ref), tmp_path).program.working_dir == ref
    assert with_absolute_working_dir(spec(None), tmp_path).program.working_dir is None
