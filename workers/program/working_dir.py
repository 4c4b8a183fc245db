"""Placeholder until the code-upload branch lands: a plain path only."""

from __future__ import annotations

from pathlib import Path


def materialize(working_dir: str | None, storage_root: Path) -> Path | None:
    if working_dir is None:
        return None
    path = Path(working_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"program.working_dir: {working_dir} is not a directory")
    return path
