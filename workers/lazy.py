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
