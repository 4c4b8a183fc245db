"""A package's public names, loaded on first use (PEP 562): the supervisor, the API and the CLI
import torch-free modules of packages whose other modules need torch, and should not pay for
importing torch (seconds) on their way to them."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_names(package: str, home: dict[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` that imports `package.<home[name]>` when `name` is first asked for."""

    def __getattr__(name: str) -> Any:
        if name not in home:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{home[name]}"), name)

    return __getattr__


def load_now(*packages: str) -> None:
    """Every name of these lazy packages, imported now in the calling thread.

    A process that imports in several threads loads them first: two threads importing torch's
    modules at once can meet in Python's per-module import locks, which break such a deadlock by
    handing one thread a partly initialised module (seen in a supervisor: "cannot import name
    'set_module' from partially initialized module 'torch.utils'", then every later import of the
    strategy registry failing)."""
    for package in packages:
        module = importlib.import_module(package)
        for name in module.__all__:
            getattr(module, name)
