"""A program's local working_dir, for the CLI: `trainyard submit` zips it and uploads it with
POST /v1/code, so the submitted spec names it `code:<sha256>`; `trainyard run` uses it in place.

The zip is the same bytes for the same files every time (entries sorted, fixed timestamps and
modes, one compression level), so re-submitting unchanged code stores nothing new. Left out:
`__pycache__/` and `.git/` directories and `*.pyc` files.
"""

from __future__ import annotations

import copy
import os
import tempfile
import zipfile
from pathlib import Path
from typing import IO

from api.cli.client import Client
from workers.spec import CODE_REF_PREFIX

SKIPPED_DIRS = frozenset({"__pycache__", ".git"})
SKIPPED_SUFFIXES = (".pyc",)
FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest a zip can say: no timestamps in the content hash
COMPRESS_LEVEL = 6
_CHUNK = 1 << 20


class WorkingDirError(ValueError):
    """A working_dir that cannot be shipped: missing, unreadable, or zipping to more than the limit."""


def local_working_dir(data: dict, spec_dir: Path) -> Path | None:
    """The local path a spec's `program.working_dir` names (a relative one from `spec_dir`), or None:
    no program, no working_dir, or already a code reference."""
    program = data.get("program")
    value = program.get("working_dir") if isinstance(program, dict) else None
    if not isinstance(value, str) or value.startswith(CODE_REF_PREFIX):
        return None
    path = Path(value).expanduser()
    return path if path.is_absolute() else (spec_dir / path).absolute()


def with_working_dir(data: dict, value: str) -> dict:
    """A copy of the spec data with `program.working_dir` set to `value`."""
    data = copy.deepcopy(data)
    data["program"]["working_dir"] = value
    return data


def files_of(directory: Path) -> list[tuple[str, Path]]:
    """(name in the zip, file) for every file shipped, sorted by name."""
    found = []
    for top, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS]
        for d in dirs:
            if os.path.islink(os.path.join(top, d)):
                raise WorkingDirError(f"program.working_dir: {os.path.join(top, d)} is a symlink to a directory, "
                                      "which is not followed; copy the directory in or remove the link")
        for name in files:
            if not name.endswith(SKIPPED_SUFFIXES):
                path = Path(top, name)
                found.append((path.relative_to(directory).as_posix(), path))
    return sorted(found)


def zip_dir(directory: Path, out: IO[bytes], max_bytes: int) -> int:
    """Write the deterministic zip of `directory` to `out`; its size. WorkingDirError once it passes
    `max_bytes` (TRAINYARD_MAX_CODE_BYTES), before anything is sent."""
    if not directory.is_dir():
        raise WorkingDirError(f"program.working_dir: {directory} is not a directory")

    def check_size() -> None:
        if out.tell() > max_bytes:
            raise WorkingDirError(f"program.working_dir: {directory} zips to more than {max_bytes} bytes, the "
                                  "upload limit (TRAINYARD_MAX_CODE_BYTES); leave data and outputs out of the "
                                  "working_dir (read them from the storage root) or raise the limit")

    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=COMPRESS_LEVEL) as zf:
        for name, path in files_of(directory):
            info = zipfile.ZipInfo(name, date_time=FIXED_TIME)
            info.compress_type, info.create_system = zipfile.ZIP_DEFLATED, 3  # 3: unix, so the mode is read
            try:
                st = os.stat(path)
                info.external_attr = (0o100755 if st.st_mode & 0o111 else 0o100644) << 16
                info.file_size = st.st_size  # zipfile picks zip64 from it
                with path.open("rb") as src, zf.open(info, "w") as dst:
                    while chunk := src.read(_CHUNK):
                        dst.write(chunk)
                        check_size()
            except OSError as exc:
                raise WorkingDirError(f"program.working_dir: cannot read {path} ({exc})") from None
            check_size()
    check_size()
    return out.tell()


def upload(client: Client, directory: Path, max_bytes: int) -> dict:
    """Zip `directory` (to a temporary file, not memory) and upload it: POST /v1/code's answer."""
    with tempfile.TemporaryFile() as f:
        zip_dir(directory, f, max_bytes)
        f.seek(0)
        return client.upload_code(f)
