"""Resolve 'package.module:factory' strings to callables (user models and datasets)."""

import importlib
from typing import Any, Callable


class EntrypointError(ValueError):
    pass


def resolve_entrypoint(spec: str, field: str) -> Callable[..., Any]:
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise EntrypointError(f"{field}: cannot import module {module_name!r} ({exc})") from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise EntrypointError(f"{field}: {module_name!r} has no callable {attr!r}")
    return factory
