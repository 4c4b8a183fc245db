"""workers.storage.Storage on a local directory and on a real S3 API (moto's server over HTTP): the same
behaviour on both, which is what lets every job file move to an object store."""

from __future__ import annotations

import pytest

from workers.storage import Storage


@pytest.fixture(scope="module")
def s3_storage(s3_server):
    return Storage.at(s3_server.create_bucket("location-test") + "/prefix")


@pytest.fixture(params=["local", "s3"])
def storage(request, tmp_path):
    return Storage.at(tmp_path / "root") if request.param == "local" else request.getfixturevalue("s3_storage")


def test_reads_back_what_it_writes_and_lists_by_name(storage):
    storage.write_text("jobs/a/recovery.json", '{"x": 1}')
    storage.write_bytes("jobs/a/logs/rank-0.log", b"0123456789")
    assert storage.read_text("jobs/a/recovery.json") == '{"x": 1}'
    assert storage.list("jobs/a") == ["logs", "recovery.json"] and storage.list("jobs/none") == []
    assert storage.read_range("jobs/a/logs/rank-0.log", 6) == b"6789" and storage.size("jobs/a/logs/rank-0.log") == 10
    assert (storage / "jobs/a").exists("logs/rank-0.log") and (storage / "jobs/a").is_dir("logs")
    assert sorted((storage / "jobs").walk_files()) == ["a/logs/rank-0.log", "a/recovery.json"]
    with pytest.raises(FileNotFoundError):
        storage.read_bytes("jobs/a/absent")
    (storage / "jobs").remove("a")
    assert not storage.exists("jobs/a/recovery.json") and storage.list("jobs") == []
    storage.remove("jobs/never-was")  # absent: nothing to do, no error


def test_uploads_and_downloads_trees(storage, tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text("{}")
    (src / "sub" / "w.bin").write_bytes(b"\0" * 1000)
    storage.upload(src, "hf")
    assert sorted((storage / "hf").walk_files()) == ["config.json", "sub/w.bin"]
    storage.download("hf", tmp_path / "back")
    assert (tmp_path / "back" / "sub" / "w.bin").read_bytes() == b"\0" * 1000


@pytest.mark.parametrize("uri, rule", [("ftp://h/x", "ftp:// is not a supported storage scheme"),
                                       ("s3://", "names no bucket")])
def test_refuses_what_it_cannot_write(uri, rule):
    with pytest.raises(ValueError, match=rule):
        Storage.at(uri)


def test_normalises_paths_and_uris(tmp_path):
    assert Storage.at(f"file://{tmp_path}/x/").uri == str(tmp_path / "x")
    assert Storage.at("s3://b/p/").uri == "s3://b/p" and (Storage.at("s3://b/p") / "q/").uri == "s3://b/p/q"
    assert Storage.at("s3://b").url("jobs/1") == "s3://b/jobs/1" and Storage.at("gs://b/x").scheme == "gs"


def _write_from_a_fork(storage: Storage, done) -> None:
    storage.write_text("forked/child.txt", "from the child")
    done.put("written")


def test_a_forked_process_reaches_the_store_with_its_own_client(s3_storage):
    """A rank's loop is forked from its actor, which already used the store (its log shipper): the
    inherited client would run its calls on the actor's event-loop thread, which the fork left behind."""
    import multiprocessing
    import queue

    s3_storage.write_text("forked/parent.txt", "from the parent")  # the parent's client and its loop exist
    context = multiprocessing.get_context("fork")
    done = context.Queue()
    child = context.Process(target=_write_from_a_fork, args=(s3_storage, done))
    child.start()
    try:
        assert done.get(timeout=30) == "written"
    except queue.Empty:
        pytest.fail("the forked process's write to the store did not return within 30 s")
    finally:
        child.kill()
        child.join()
    assert s3_storage.read_text("forked/child.txt") == "from the child"
