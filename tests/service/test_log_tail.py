"""A log's last lines, read from its end (service/log_tail.py)."""

from __future__ import annotations

import io
import random

import pytest

from service.log_tail import tail_file, tail_lines


def naive(data: bytes, lines: int) -> bytes:
    return b"".join(data.splitlines(keepends=True)[-lines:]) if lines else b""


class CountingReader(io.BytesIO):
    """Counts the bytes read: the tail must not read the file."""

    def __init__(self, data: bytes):
        super().__init__(data)
        self.bytes_read = 0

    def read(self, n: int | None = -1) -> bytes:
        out = super().read(n)
        self.bytes_read += len(out)
        return out


@pytest.mark.parametrize("trailing_newline", [True, False])
@pytest.mark.parametrize("block", [1, 7, 64, 4096])
def test_the_same_lines_as_reading_the_whole_file(trailing_newline, block):
    rng = random.Random(block)
    rows = [("x" * rng.randrange(0, 40) + ("é" if rng.random() < 0.2 else "")).encode() for _ in range(300)]
    data = b"\n".join(rows) + (b"\n" if trailing_newline else b"")
    for lines in (0, 1, 2, 5, 37, 299, 300, 301, 10_000):
        assert tail_lines(io.BytesIO(data), lines, len(data), block) == naive(data, lines), (lines, block)


def test_reads_only_the_end_of_a_large_log():
    data = b"".join(b"step %d loss 1.2345\n" % i for i in range(500_000))  # about 11 MB
    f = CountingReader(data)
    out = tail_lines(f, 200, len(data))
    assert out == naive(data, 200) and out.endswith(b"step 499999 loss 1.2345\n")
    assert f.bytes_read <= 2 * 64 * 1024  # a block or two, not 11 MB


def test_a_file_and_its_size(tmp_path):
    assert tail_file(tmp_path / "missing.log", 10) == ("", 0)
    path = tmp_path / "rank-0.log"
    path.write_bytes(b"a\nb\nc")
    assert tail_file(path, 2) == ("b\nc", 5)
    assert tail_file(path, 0) == ("", 5)
