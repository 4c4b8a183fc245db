"""A program's working_dir on a worker node: a local path as given, or uploaded code.

Uploaded code (POST /v1/code) is a zip in the store, `code/<sha256>.zip` under the storage root (a
local directory or an object store), named in the spec as `code:<sha256>`. Each node fetches it and
unpacks it once into `<tmp>/trainyard-code/<sha256>/`, which all of the node's ranks share: the zip is
hashed and checked, extracted into a private temporary directory, and that is renamed into place in
one step, so a rank sees either nothing or the complete tree, and of ranks racing to unpack it one
rename wins and the others use its result. A working_dir that is a directory on an object store
(`s3://bucket/root/dir`, admitted under the storage root) is downloaded for each rank.

`archive_problem` is the one statement of what a code zip may contain; the service applies it at
upload (service/code_store.py) and the workers apply it again here, as the stored file is not theirs.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

from workers.spec.program import CODE_REF_PREFIX
from workers.storage import Storage

FIELD = "program.working_dir"
CODE_DIR = "code"  # under the storage root
CACHE_DIR = "trainyard-code"  # under the node's temporary directory
_SHA256 = re.compile(r"[0-9a-f]{64}")
_DRIVE = re.compile(r"^[A-Za-z]:")


class CodeArchiveError(ValueError):
    """Uploaded code that may not be unpacked: malformed reference, changed zip, unsafe entry."""


def code_sha(ref: str) -> str:
    """The sha256 of a `code:<sha256>` reference (64 lower-case hex digits)."""
    sha = ref.removeprefix(CODE_REF_PREFIX)
    if not ref.startswith(CODE_REF_PREFIX) or not _SHA256.fullmatch(sha):
        raise CodeArchiveError(f"{FIELD}: {ref!r} is not a code reference ('{CODE_REF_PREFIX}' and the 64 "
                               "lower-case hex digits of the sha256 that POST /v1/code answered)")
    return sha


def stored_zip(sha: str) -> str:
    """The code's name under the storage root."""
    return f"{CODE_DIR}/{sha}.zip"


def entry_problem(info: zipfile.ZipInfo) -> str | None:
    """Why one zip entry may not be unpacked into a working_dir, or None."""
    name = info.filename
    posix = name.replace("\\", "/")
    if posix.startswith("/") or _DRIVE.match(posix):
        return f"zip entry {name!r}: absolute paths are refused (entries are relative to the working_dir)"
    if ".." in PurePosixPath(posix).parts:
        return f"zip entry {name!r}: '..' is refused (an entry may not point outside the working_dir)"
    if "\x00" in name:
        return f"zip entry {name!r}: a NUL character is refused"
    if stat.S_ISLNK(info.external_attr >> 16):
        return f"zip entry {name!r}: symlinks are refused (zip the file it points to instead)"
    if info.flag_bits & 0x1:
        return f"zip entry {name!r}: encrypted entries are refused"
    return None


def archive_problem(zf: zipfile.ZipFile, max_unpacked_bytes: int | None = None) -> str | None:
    """Why a zip may not be a working_dir (the first broken rule), or None."""
    seen: set[str] = set()
    unpacked = 0
    for info in zf.infolist():
        if problem := entry_problem(info):
            return problem
        if info.filename in seen:
            return f"zip entry {info.filename!r}: appears twice"
        seen.add(info.filename)
        unpacked += info.file_size
    if max_unpacked_bytes is not None and unpacked > max_unpacked_bytes:
        return (f"the entries unpack to {unpacked} bytes, over the limit of {max_unpacked_bytes} bytes "
                "(a working_dir holds code and small files; read large data from the storage root)")
    return None


def materialize(working_dir: str | None, storage_root: Storage | str | os.PathLike) -> Path | None:
    """The directory a program runs in: None for none; a `code:<sha256>` reference fetched and unpacked
    on this node; a directory on an object store downloaded; a plain path as it is (FileNotFoundError
    naming program.working_dir if it is missing)."""
    if working_dir is None:
        return None
    root = storage_root if isinstance(storage_root, Storage) else Storage.at(storage_root)
    if working_dir.startswith(CODE_REF_PREFIX):
        sha = code_sha(working_dir)
        return _unpacked(sha, root)
    if "://" in working_dir:
        return _downloaded(Storage.at(working_dir))
    path = Path(working_dir)
    if not path.exists():
        raise FileNotFoundError(f"{FIELD}: {working_dir} does not exist on this node")
    if not path.is_dir():
        raise NotADirectoryError(f"{FIELD}: {working_dir} is not a directory")
    return path


def _unpacked(sha: str, root: Storage) -> Path:
    cache = _cache_root()
    target = cache / sha
    if target.is_dir():  # complete: only a finished extraction is ever renamed to this name
        return target
    name = stored_zip(sha)
    if not root.exists(name):
        raise FileNotFoundError(f"{FIELD}: {CODE_REF_PREFIX}{sha} is not in the code store ({root.url(name)}); "
                                "upload the directory with POST /v1/code")
    staging = Path(tempfile.mkdtemp(prefix=f".{sha[:16]}-", dir=cache))
    try:
        zip_path = root.local_path / name if root.is_local else staging.with_suffix(".zip")
        if not root.is_local:
            root.download(name, zip_path)
        with zip_path.open("rb") as f:  # one open file: hashed, then read, so what is checked is what is unpacked
            digest = hashlib.file_digest(f, "sha256").hexdigest()
            if digest != sha:
                raise CodeArchiveError(f"{FIELD}: {root.url(name)} has sha256 {digest}, not {sha}: the stored zip "
                                       "was changed after its upload; upload the directory again")
            f.seek(0)
            try:
                with zipfile.ZipFile(f) as zf:
                    if problem := archive_problem(zf):
                        raise CodeArchiveError(f"{FIELD}: {CODE_REF_PREFIX}{sha}: {problem}")
                    _extract(zf, staging)
            except zipfile.BadZipFile as exc:
                raise CodeArchiveError(f"{FIELD}: {root.url(name)} is not a valid zip ({exc})") from None
        try:
            os.rename(staging, target)
        except OSError:
            if not target.is_dir():  # not another rank's rename winning the race: a real failure
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if not root.is_local:
            staging.with_suffix(".zip").unlink(missing_ok=True)
    return target


def _downloaded(directory: Storage) -> Path:
    """A private copy of a directory on an object store (it may change between attempts: not cached)."""
    if not directory.is_dir():
        raise FileNotFoundError(f"{FIELD}: {directory.uri} is not a directory in the store")
    target = Path(tempfile.mkdtemp(prefix="workdir-", dir=_cache_root())) / "working_dir"
    directory.download("", target)
    return target


def _cache_root() -> Path:
    """This node's cache of unpacked code, private to the user the workers run as: another local user
    could otherwise plant a directory under a hash's name in the shared temporary directory."""
    cache = Path(tempfile.gettempdir()) / CACHE_DIR
    cache.mkdir(mode=0o700, exist_ok=True)
    st = cache.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise PermissionError(f"{cache}: must be a directory owned by uid {os.getuid()} and writable by it "
                              "alone (it caches the code programs run)")
    return cache


def _extract(zf: zipfile.ZipFile, into: Path) -> None:
    root = into.resolve()
    for info in zf.infolist():
        dest = (root / info.filename.replace("\\", "/")).resolve()
        if not dest.is_relative_to(root):  # archive_problem refused this already; never write outside
            raise CodeArchiveError(f"{FIELD}: zip entry {info.filename!r} points outside the working_dir")
        if info.is_dir():
            dest.mkdir(parents=True, exist_ok=True)
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        with zf.open(info) as src, dest.open("xb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
        executable = (info.external_attr >> 16) & 0o111
        dest.chmod(0o755 if executable else 0o644)
