"""Which checkpoints in a directory are complete, newest last.

A checkpoint is an entry whose name ends in its step number after `-`, `_` or `.` (`step-120`,
`epoch_3`, `00000120.pt`; an extension may follow):
a file (write it to a temporary name and rename it, so a half-written file never has the final
name), or a directory holding a DCP `.metadata` file (torch.distributed.checkpoint writes it
last) or an empty `COMPLETE` marker the program writes when it is done.

On an object store the directory is a URI (`s3://bucket/jobs/<id>/checkpoints`) and so is each
checkpoint returned: programs read and write it with fsspec or DCP (`checkpoint_id=` the URI).
"""

from __future__ import annotations

import re
from pathlib import Path

_STEP = re.compile(r"(?:^|[-_.])(\d+)(?:\.[A-Za-z0-9]+)?$")
COMPLETE_MARKERS = (".metadata", "COMPLETE")


def step_of(path: Path) -> int | None:
    match = _STEP.search(path.name)
    return int(match.group(1)) if match else None


def is_complete(path: Path) -> bool:
    if path.name.startswith(".") or path.name.endswith((".tmp", ".partial")):
        return False
    if path.is_dir():
        return any((path / marker).is_file() for marker in COMPLETE_MARKERS)
    return path.is_file()


def complete_checkpoints_in(directory: str | Path) -> list[tuple[int, Path]] | list[tuple[int, str]]:
    """(step, path) of every complete checkpoint under `directory`, oldest first; (step, URI) on an
    object store."""
    if "://" in str(directory) and not str(directory).startswith("file://"):
        return _complete_on_store(str(directory))
    root = Path(str(directory).removeprefix("file://"))
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        step = step_of(entry)
        if step is not None and is_complete(entry):
            found.append((step, entry))
    return sorted(found)


def _complete_on_store(uri: str) -> list[tuple[int, str]]:
    import fsspec  # only for an object store: the job's storage, which the rank's environment reaches

    fs, root = fsspec.core.url_to_fs(uri)
    fs.invalidate_cache()  # other ranks and processes write here: never a cached listing
    scheme, found = uri.split("://", 1)[0], []
    try:
        entries = fs.ls(root, detail=True)
    except FileNotFoundError:
        return []
    for entry in entries:
        path = str(entry["name"]).rstrip("/")
        name = path.rsplit("/", 1)[-1]
        step = step_of(Path(name))
        if step is None or name.startswith(".") or name.endswith((".tmp", ".partial")):
            continue
        if entry["type"] != "directory" or any(fs.exists(f"{path}/{m}") for m in COMPLETE_MARKERS):
            found.append((step, f"{scheme}://{path}"))
    return sorted(found)


def latest_checkpoint_in(directory: str | Path) -> Path | str | None:
    done = complete_checkpoints_in(directory)
    return done[-1][1] if done else None
