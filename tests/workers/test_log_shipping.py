"""Logs on an object store: a growing local file shipped in chunks (workers/storage/log_shipping.py), read
back as one stream and tailed from its end (workers/storage/log_chunks.py, service/job_logs.py), on a real
S3 API (moto's server over HTTP) and on a local directory."""

from __future__ import annotations

import time
import uuid

import pytest

from service.job_logs import ShippedLog
from workers.storage import Storage
from workers.storage.log_chunks import LogCursor, chunk_starts, log_size
from workers.storage.log_shipping import LogShipper, ShippingPolicy

SMALL = ShippingPolicy(interval_s=0.05, chunk_bytes=1000, seal_s=3600)


@pytest.fixture(scope="module")
def s3_bucket(s3_server):
    return Storage.at(s3_server.create_bucket("log-shipping"))


@pytest.fixture(params=["local", "s3"])
def job(request, tmp_path):
    if request.param == "local":
        return Storage.at(tmp_path / "store" / "jobs" / "j")
    return request.getfixturevalue("s3_bucket") / f"jobs/{uuid.uuid4().hex[:8]}"


def lines(first: int, n: int) -> bytes:
    return b"".join(b"step %06d loss 1.2345\n" % i for i in range(first, first + n))


def read_all(job: Storage, log: str) -> bytes:
    cursor, out = LogCursor(job, log), bytearray()
    while piece := cursor.read():
        out += piece
    return bytes(out)


def test_a_growing_file_reads_back_whole_from_its_chunks(job, tmp_path):
    local = tmp_path / "rank-0.log"
    local.write_bytes(b"")
    shipper = LogShipper(local, job, "logs/rank-0", SMALL)
    follower = LogCursor(job, "logs/rank-0")
    seen = bytearray()
    for i in range(5):
        with local.open("ab") as f:
            f.write(lines(i * 70, 70))  # 70 lines of 24 bytes: chunks fill and seal, one stays open
        shipper.ship()
        while piece := follower.read(700):
            seen += piece
    assert bytes(seen) == local.read_bytes() == lines(0, 350)
    starts = chunk_starts(job, "logs/rank-0")
    assert starts == list(range(0, 350 * 24, 1000)) and log_size(job, "logs/rank-0") == 350 * 24


def test_a_restarted_writer_continues_after_what_is_shipped(job, tmp_path):
    first, second = tmp_path / "a.log", tmp_path / "b.log"
    first.write_bytes(lines(0, 10))
    LogShipper(first, job, "logs/rank-1", SMALL).close()
    second.write_bytes(lines(10, 5))  # a new process on another node: its own, new local file
    LogShipper(second, job, "logs/rank-1", SMALL).close()
    assert read_all(job, "logs/rank-1") == lines(0, 15)


def test_the_thread_ships_while_the_file_grows_and_seals_old_chunks(job, tmp_path):
    local = tmp_path / "supervisor.log"
    local.write_bytes(b"")
    shipper = LogShipper(local, job, "logs/supervisor", ShippingPolicy(interval_s=0.05, seal_s=0.2)).start()
    try:
        with local.open("ab") as f:
            f.write(b"first\n")
            f.flush()
            deadline = time.monotonic() + 10
            while read_all(job, "logs/supervisor") != b"first\n":
                assert time.monotonic() < deadline, "not shipped in 10 s"
                time.sleep(0.05)
            time.sleep(0.3)
            f.write(b"second\n")
    finally:
        shipper.close()
    assert read_all(job, "logs/supervisor") == b"first\nsecond\n"
    assert chunk_starts(job, "logs/supervisor") == [0, 6]  # the first chunk was sealed by age


def test_the_tail_of_a_large_shipped_log_reads_only_its_end(s3_bucket, tmp_path, monkeypatch):
    job = s3_bucket / f"jobs/{uuid.uuid4().hex[:8]}"
    local = tmp_path / "rank-0.log"
    local.write_bytes(lines(0, 250_000))  # 6 MB: five chunks of 1 MiB and an open one
    shipper = LogShipper(local, job, "logs/rank-0")
    shipper.ship()
    calls: list[tuple[str, int]] = []
    read_range = Storage.read_range

    def counted(self, rel, start, end=None):
        data = read_range(self, rel, start, end)
        calls.append((rel, len(data)))
        return data

    def whole(self, rel):
        raise AssertionError(f"read the whole object {rel}")

    monkeypatch.setattr(Storage, "read_range", counted)
    monkeypatch.setattr(Storage, "read_bytes", whole)
    log = ShippedLog(job, "rank-0.log")
    assert log.tail(200) == lines(250_000 - 200, 200).decode()
    read = sum(n for _, n in calls)
    print(f"tail 200 lines of {local.stat().st_size} bytes: {read} bytes in {len(calls)} ranged reads")
    assert read <= 2 * 64 * 1024 and {rel for rel, _ in calls} == {"logs/rank-0/0000000005242880"}
    with local.open("ab") as f:
        f.write(b"one more\n")
    shipper.ship()
    assert log.read_more() == b"one more\n" and log.read_more() == b""  # a follower continues after the tail


def test_a_store_that_fails_at_first_gets_the_whole_log_later(s3_server, tmp_path):
    """The store unusable when the rank starts (here: its bucket not there yet) costs the log nothing."""
    name = f"late-{uuid.uuid4().hex[:8]}"
    job = Storage.at(f"s3://{name}/jobs/j")
    local = tmp_path / "rank-0.log"
    local.write_bytes(lines(0, 3))
    shipper = LogShipper(local, job, "logs/rank-0", SMALL)  # starting never touches the store
    with pytest.raises(FileNotFoundError):
        shipper.ship()  # the thread logs this and tries again at its next tick
    s3_server.create_bucket(name)
    with local.open("ab") as f:
        f.write(lines(3, 2))
    shipper.close()
    assert read_all(job, "logs/rank-0") == lines(0, 5)
