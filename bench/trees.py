"""An earlier checkout of this repository, for a bench that measures it beside this tree in one run."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def tree_at(rev: str, path: Path) -> Path:
    """A checkout of `rev` (git worktree) at `path`, made once."""
    if not (path / "service").exists():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), rev], check=True,
                       capture_output=True)
    return path
