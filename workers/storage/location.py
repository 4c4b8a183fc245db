"""A directory on a local disk or on an object store (S3, GCS), addressed by one URI, through fsspec.

Nothing here assumes a disk that other machines share: every read and write goes to the URI's
filesystem, so a file one node writes to `s3://bucket/jobs/x` is what every other node and the
control plane read. Credentials and endpoints come from each store's standard environment variables
(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, AWS_REGION for S3 and S3-compatible
stores; GOOGLE_APPLICATION_CREDENTIALS for GCS), read by the store's own client library.

Relative names (`rel`) use "/" on every store; "" is the directory itself.
"""

from __future__ import annotations

import errno
import os
import posixpath
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import IO, Any

import fsspec

# URI scheme -> the fsspec protocol (and the package that brings it).
SCHEMES = {"file": "file", "s3": "s3", "gs": "gcs", "gcs": "gcs"}
PACKAGES = {"s3": "s3fs", "gcs": "gcsfs"}


# The variables a store's client reads: a filesystem made under other values is not reused.
CLIENT_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_REGION",
              "AWS_DEFAULT_REGION", "AWS_PROFILE", "GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST")


def _filesystem(protocol: str) -> fsspec.AbstractFileSystem:
    return _filesystem_for(protocol, tuple(os.environ.get(k) for k in CLIENT_ENV))


@lru_cache
def _filesystem_for(protocol: str, client_env: tuple[str | None, ...]) -> fsspec.AbstractFileSystem:
    if protocol == "file":
        return fsspec.filesystem("file")
    # Listings are never cached: other processes write the same prefixes (ranks, supervisors,
    # the control plane), and a cached listing would hide their objects.
    return fsspec.filesystem(protocol, use_listings_cache=False, skip_instance_cache=True)


# A forked process (a rank's loop, workers/runtime/rank_process.py; a DataLoader worker) makes its own
# clients: an async store's filesystem runs its calls on its parent's event-loop thread, which a fork
# leaves behind, so an inherited one would wait for ever.
os.register_at_fork(after_in_child=_filesystem_for.cache_clear)


@dataclass(frozen=True)
class Storage:
    """One directory: `uri` is `s3://bucket/prefix`, `gs://bucket/prefix` or an absolute local path."""

    uri: str

    @classmethod
    def at(cls, location: str | os.PathLike) -> Storage:
        """From a URI, a `file://` URI or a path (made absolute); ValueError for a scheme fsspec cannot write."""
        text = os.fspath(location)
        scheme, sep, rest = text.partition("://")
        if not sep:
            return cls(str(Path(text).resolve()))
        if scheme not in SCHEMES:
            raise ValueError(f"{scheme}:// is not a supported storage scheme (use one of "
                             f"{', '.join(s + '://' for s in SCHEMES)} or a path)")
        if scheme == "file":
            return cls(str(Path(rest).resolve()))
        bucket = rest.split("/", 1)[0]
        if not bucket:
            raise ValueError(f"{text}: names no bucket ({scheme}://bucket/prefix)")
        return cls(f"{scheme}://{rest.strip('/')}")

    def __str__(self) -> str:  # the URI (a path on local storage): what str(path) callers expect
        return self.uri

    @classmethod
    def of(cls, location: Storage | str | os.PathLike) -> Storage:
        """`location` as a Storage: a Storage as it is, else `Storage.at` (what crosses Ray is the URI)."""
        return location if isinstance(location, Storage) else cls.at(location)

    @property
    def parent(self) -> Storage:
        """The directory above this one (within the same bucket)."""
        return Storage(posixpath.dirname(self.uri.rstrip("/")))

    @property
    def name(self) -> str:
        return posixpath.basename(self.uri.rstrip("/"))

    @property
    def scheme(self) -> str:
        return self.uri.split("://", 1)[0] if "://" in self.uri else "file"

    @property
    def is_local(self) -> bool:
        return self.scheme == "file"

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        protocol = SCHEMES[self.scheme]
        try:
            return _filesystem(protocol)
        except ImportError as exc:
            raise ImportError(f"storage {self.scheme}:// needs the package {PACKAGES.get(protocol, protocol)} "
                              "(pip install -e '.[storage]')") from exc

    def __truediv__(self, rel: str) -> Storage:
        return Storage(self.url(rel))

    def url(self, rel: str = "") -> str:
        """The URI of `rel` under this directory (what DCP and other fsspec users take)."""
        rel = rel.strip("/")
        return posixpath.join(self.uri, rel) if rel else self.uri

    def _path(self, rel: str = "") -> str:
        url = self.url(rel)
        return url if self.is_local else url.split("://", 1)[1]

    @property
    def local_path(self) -> Path:
        """This directory on the local disk; only for local storage (object stores have none)."""
        if not self.is_local:
            raise ValueError(f"{self.uri} is on an object store, not a local disk")
        return Path(self.uri)

    # --- reading ---
    def exists(self, rel: str = "") -> bool:
        return bool(self.fs.exists(self._path(rel)))

    def is_dir(self, rel: str = "") -> bool:
        return bool(self.fs.isdir(self._path(rel)))

    def read_bytes(self, rel: str) -> bytes:
        """FileNotFoundError when absent, on every store."""
        return bytes(self.fs.cat_file(self._path(rel)))

    def read_text(self, rel: str) -> str:
        return self.read_bytes(rel).decode()

    def size(self, rel: str) -> int:
        return int(self.fs.size(self._path(rel)))

    def read_range(self, rel: str, start: int, end: int | None = None) -> bytes:
        """Bytes [start, end) of `rel`: a log's tail without reading the whole object. b"" from its end
        on, on every store (S3 answers a range past the end with an error, a local file with nothing)."""
        try:
            return bytes(self.fs.cat_file(self._path(rel), start=start, end=end))
        except OSError as exc:
            if exc.errno == errno.EINVAL and not isinstance(exc, FileNotFoundError):  # 416: range not satisfiable
                return b""
            raise

    def read_ranges(self, rel: str, ranges: list[tuple[int, int]]) -> list[tuple[int, bytes]]:
        """(start, bytes) of each [start, end) range of `rel`, fetched concurrently on an object store
        (one ranged GET each). FileNotFoundError when the file is absent or shorter than a range."""
        if not ranges:
            return []
        path = self._path(rel)
        try:
            parts = self.fs.cat_ranges([path] * len(ranges), [s for s, _ in ranges], [e for _, e in ranges],
                                       on_error="raise")
        except OSError as exc:
            if exc.errno == errno.EINVAL and not isinstance(exc, FileNotFoundError):  # 416: a range past the end
                raise FileNotFoundError(f"{self.url(rel)}: shorter than a range asked for ({exc})") from exc
            raise
        out = []
        for (start, end), data in zip(ranges, parts, strict=True):
            if len(data) != end - start:
                raise FileNotFoundError(f"{self.url(rel)}: {len(data)} bytes at {start}, {end - start} expected "
                                        "(the file is shorter than its checkpoint's metadata says)")
            out.append((start, bytes(data)))
        return out

    def list(self, rel: str = "") -> list[str]:
        """Names directly under `rel`, sorted; [] when it does not exist."""
        try:
            entries = self.fs.ls(self._path(rel), detail=False)
        except FileNotFoundError:
            return []
        base = self._path(rel).rstrip("/")
        return sorted(posixpath.basename(str(e).rstrip("/")) for e in entries if str(e).rstrip("/") != base)

    def sizes(self, rel: str = "") -> dict[str, int]:
        """Size of each file directly under `rel`, by name (one listing call); {} when absent."""
        try:
            entries = self.fs.ls(self._path(rel), detail=True)
        except FileNotFoundError:
            return {}
        return {posixpath.basename(str(e["name"]).rstrip("/")): int(e.get("size") or 0)
                for e in entries if e.get("type") == "file"}

    def open(self, rel: str, mode: str = "rb") -> IO[Any]:
        return self.fs.open(self._path(rel), mode)

    # --- writing ---
    def write_bytes(self, rel: str, data: bytes) -> None:
        """Whole or not at all: readers never see half an object (a local file is renamed into place;
        an object store's put is atomic)."""
        if not self.is_local:
            self.fs.pipe_file(self._path(rel), data)
            return
        path = Path(self._path(rel))
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def write_text(self, rel: str, text: str) -> None:
        self.write_bytes(rel, text.encode())

    def remove(self, rel: str = "") -> None:
        """Delete `rel` (a file or a whole directory); nothing when absent."""
        try:
            self.fs.rm(self._path(rel), recursive=True)
        except FileNotFoundError:
            pass

    def upload(self, local: Path, rel: str) -> None:
        """Copy a local file or directory tree to `rel`."""
        if self.is_local and Path(self._path(rel)) == Path(local).resolve():
            return
        files = sorted(p for p in Path(local).rglob("*") if p.is_file()) if Path(local).is_dir() else [Path(local)]
        for path in files:
            name = posixpath.join(rel, path.relative_to(local).as_posix()) if path != Path(local) else rel
            if self.is_local:
                self.write_bytes(name, path.read_bytes())
            else:  # streamed (multipart on S3), never whole in memory
                self.fs.put_file(str(path), self._path(name))

    def download(self, rel: str, local: Path) -> None:
        """Copy `rel` (a file or a directory tree) to a local path."""
        self.fs.get(self._path(rel), str(local), recursive=self.is_dir(rel))

    def walk_files(self, rel: str = "") -> Iterator[str]:
        """Every file under `rel`, as names relative to it."""
        base = self._path(rel).rstrip("/")
        for path in sorted(self.fs.find(base)):
            yield str(path)[len(base) + 1:]
