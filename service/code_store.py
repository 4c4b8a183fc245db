"""The code store: programs' working_dirs, uploaded as zips (POST /v1/code), kept by content hash.

One object per content, `code/<sha256>.zip` in the storage (a local directory or an object store),
which the workers fetch and unpack (workers/program/working_dir.py) and a spec names as `code:<sha256>`.
An upload is written to a temporary local file while it is hashed (in the code directory itself on
local storage, the service's temporary directory otherwise), checked as a whole (a readable zip, every
entry relative, no `..`, no symlinks: workers.program.working_dir.archive_problem), then put in place
in one step (a rename, or one PUT to the object store): a reader sees a complete zip or none, and the
same content uploaded twice, even at once, is one object.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from service.refusals import InvalidRequest, TooLarge
from workers.program.working_dir import CODE_DIR, archive_problem, code_sha, stored_zip
from workers.spec.program import CODE_REF_PREFIX
from workers.storage import Storage

# A zip may unpack to this many times the upload limit (code and text compress 3-10x; a zip bomb far more).
UNPACKED_RATIO = 16


@dataclass(frozen=True)
class StoredCode:
    sha256: str
    size: int  # bytes
    created: bool  # False: this content was already stored

    @property
    def ref(self) -> str:
        return f"{CODE_REF_PREFIX}{self.sha256}"


def is_stored(storage: Storage, ref: str) -> bool:
    """Whether a `code:<sha256>` reference names stored code (ValueError for a malformed one)."""
    return storage.exists(stored_zip(code_sha(ref)))


class CodeStore:
    def __init__(self, storage: Storage, max_bytes: int):
        self.storage, self.max_bytes = storage, max_bytes

    def begin(self) -> CodeUpload:
        return CodeUpload(self)


class CodeUpload:
    """One upload as it arrives: `write` each chunk, then `finish`; `discard` (always safe, also after
    `finish`) removes what an unfinished upload left. TooLarge past the limit, InvalidRequest for a bad zip."""

    def __init__(self, store: CodeStore):
        self.store = store
        # On local storage beside its final name, so that storing it is a rename.
        directory = store.storage.local_path / CODE_DIR if store.storage.is_local else Path(tempfile.gettempdir())
        directory.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".upload-", suffix=".part", dir=directory)
        self._file, self._path = os.fdopen(fd, "wb"), Path(name)
        self._hash, self._size = hashlib.sha256(), 0

    def write(self, chunk: bytes | bytearray) -> None:
        self._size += len(chunk)
        if self._size > self.store.max_bytes:
            raise TooLarge(f"body: a code upload of {self._size} bytes or more is over the limit of "
                           f"{self.store.max_bytes} bytes (TRAINYARD_MAX_CODE_BYTES)", "body")
        self._hash.update(chunk)
        self._file.write(chunk)

    def finish(self) -> StoredCode:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        _check_zip(self._path, self.store.max_bytes * UNPACKED_RATIO)
        sha = self._hash.hexdigest()
        storage, name = self.store.storage, stored_zip(sha)
        if storage.exists(name):  # the same content, stored before (idempotent)
            self._path.unlink()
            return StoredCode(sha, self._size, created=False)
        # Atomic either way; a concurrent upload of the same bytes writes the same content.
        if storage.is_local:
            os.replace(self._path, storage.local_path / name)
        else:
            storage.upload(self._path, name)  # one PUT (multipart for a large zip): whole or absent
            self._path.unlink()
        return StoredCode(sha, self._size, created=True)

    def discard(self) -> None:
        self._file.close()
        self._path.unlink(missing_ok=True)


def _check_zip(path: Path, max_unpacked_bytes: int) -> None:
    def refuse(rule: str) -> InvalidRequest:
        return InvalidRequest(f"body: {rule}", "body")

    try:
        with zipfile.ZipFile(path) as zf:
            if problem := archive_problem(zf, max_unpacked_bytes):
                raise refuse(problem)
            if (broken := zf.testzip()) is not None:
                raise refuse(f"zip entry {broken!r}: its content does not match its checksum (a damaged zip)")
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, NotImplementedError, EOFError, ValueError) as exc:
        raise refuse(f"must be a zip archive of the working_dir, sent as application/zip ({exc})") from None
