"""workers/program/working_dir.py: a program's working_dir on a node. Uploaded code is unpacked
once per node (checked against its hash, never outside its directory), concurrently safe; a plain
path is used as it is."""

from __future__ import annotations

import hashlib
import io
import stat
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from workers.program.working_dir import CACHE_DIR, CodeArchiveError, materialize


@pytest.fixture(autouse=True)
def node_tmp(tmp_path, monkeypatch) -> Path:
    """This test's own node temporary directory (tempfile.gettempdir()), so caches never mix."""
    node = tmp_path / "node-tmp"
    node.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(node))
    return node


def make_zip(files: dict[str, bytes], modes: dict[str, int] | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            info = zipfile.ZipInfo(name)
            info.create_system, info.external_attr = 3, (stat.S_IFREG | (modes or {}).get(name, 0o644)) << 16
            zf.writestr(info, data)
    return buf.getvalue()


def store(root: Path, data: bytes, as_sha: str | None = None) -> str:
    """Put a zip into the code store under its hash (or another name); its reference."""
    sha = as_sha or hashlib.sha256(data).hexdigest()
    (root / "code").mkdir(parents=True, exist_ok=True)
    (root / "code" / f"{sha}.zip").write_bytes(data)
    return f"code:{sha}"


def leftovers(node_tmp: Path) -> list[str]:
    cache = node_tmp / CACHE_DIR
    return sorted(p.name for p in cache.iterdir()) if cache.is_dir() else []


def test_none_is_none_and_a_plain_path_is_itself(tmp_path):
    assert materialize(None, tmp_path) is None
    assert materialize(str(tmp_path), tmp_path / "storage") == tmp_path
    with pytest.raises(FileNotFoundError, match="program.working_dir"):
        materialize(str(tmp_path / "absent"), tmp_path)
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError, match="program.working_dir"):
        materialize(str(tmp_path / "file"), tmp_path)


def test_a_code_ref_is_unpacked_into_the_node_cache_with_its_modes(tmp_path, node_tmp):
    ref = store(tmp_path, make_zip({"train.py": b"print(1)\n", "bin/run.sh": b"#!/bin/sh\n", "pkg/__init__.py": b""},
                                   modes={"bin/run.sh": 0o755}))
    out = materialize(ref, tmp_path)
    assert out == node_tmp / CACHE_DIR / ref.removeprefix("code:")
    assert (out / "train.py").read_bytes() == b"print(1)\n" and (out / "pkg" / "__init__.py").exists()
    assert (out / "bin" / "run.sh").stat().st_mode & 0o111 and not (out / "train.py").stat().st_mode & 0o111
    assert leftovers(node_tmp) == [ref.removeprefix("code:")]  # no staging directory left


def test_unpacking_is_once_per_node(tmp_path, node_tmp):
    ref = store(tmp_path, make_zip({"train.py": b"x"}))
    first = materialize(ref, tmp_path)
    (first / "written-by-rank-0").write_text("")  # a second call must not unpack again over it
    (tmp_path / "code" / f"{ref.removeprefix('code:')}.zip").unlink()  # ... nor even need the store
    assert materialize(ref, tmp_path) == first and (first / "written-by-rank-0").exists()


def test_concurrent_ranks_on_a_node_all_get_one_complete_tree(tmp_path, node_tmp):
    files = {f"mod{i}.py": bytes(range(256)) * 40 for i in range(50)}
    ref = store(tmp_path, make_zip(files))
    with ThreadPoolExecutor(8) as pool:
        dirs = set(pool.map(lambda _: materialize(ref, tmp_path), range(16)))
    (out,) = dirs
    assert {p.name: p.read_bytes() for p in out.iterdir()} == files
    assert leftovers(node_tmp) == [ref.removeprefix("code:")]


def test_a_tampered_zip_is_refused_and_nothing_is_unpacked(tmp_path, node_tmp):
    original = make_zip({"train.py": b"print('mine')\n"})
    ref = store(tmp_path, make_zip({"train.py": b"print('not mine')\n"}),
                as_sha=hashlib.sha256(original).hexdigest())
    with pytest.raises(CodeArchiveError, match="program.working_dir.*sha256.*changed"):
        materialize(ref, tmp_path)
    assert leftovers(node_tmp) == []


def test_a_zip_slip_is_refused_even_under_its_own_hash(tmp_path, node_tmp):
    ref = store(tmp_path, make_zip({"ok.py": b"", "../escaped.py": b"x"}))
    with pytest.raises(CodeArchiveError, match="'..' is refused"):
        materialize(ref, tmp_path)
    assert leftovers(node_tmp) == [] and not (node_tmp / CACHE_DIR / "escaped.py").exists()
    assert not list(tmp_path.rglob("escaped.py"))


def test_a_missing_or_malformed_ref_names_the_field(tmp_path):
    with pytest.raises(FileNotFoundError, match="program.working_dir.*not in the code store"):
        materialize("code:" + "a" * 64, tmp_path)
    with pytest.raises(CodeArchiveError, match="program.working_dir.*not a code reference"):
        materialize("code:ABC", tmp_path)


def test_a_cache_directory_others_can_write_is_refused(tmp_path, node_tmp):
    ref = store(tmp_path, make_zip({"train.py": b"x"}))
    (node_tmp / CACHE_DIR).mkdir(mode=0o777)
    (node_tmp / CACHE_DIR).chmod(0o777)  # as another local user could have made it
    with pytest.raises(PermissionError, match="writable by it alone"):
        materialize(ref, tmp_path)


def test_uploaded_code_and_a_directory_on_an_object_store_are_fetched(s3_server, tmp_path, node_tmp):
    """No shared disk: the zip (and a plain working_dir under an s3:// root) come from the store."""
    from workers.storage import Storage

    root = Storage.at(s3_server.create_bucket("working-dir") + "/root")
    data = make_zip({"train.py": b"print('hi')\n", "pkg/util.py": b"X = 1\n"})
    sha = hashlib.sha256(data).hexdigest()
    root.write_bytes(f"code/{sha}.zip", data)
    out = materialize(f"code:{sha}", root)
    assert (out / "pkg" / "util.py").read_bytes() == b"X = 1\n" and leftovers(node_tmp) == [sha]
    root.write_bytes("code/" + "b" * 64 + ".zip", data)  # stored under another hash: refused
    with pytest.raises(CodeArchiveError, match="was changed after its upload"):
        materialize("code:" + "b" * 64, root)
    root.write_text("dirs/w/run.py", "print(1)\n")
    assert (materialize(root.url("dirs/w"), root) / "run.py").read_text() == "print(1)\n"
    with pytest.raises(FileNotFoundError, match="program.working_dir.*not a directory in the store"):
        materialize(root.url("dirs/none"), root)
