"""Packages whose names load on first use (workers/lazy.py) name each of them twice: in the table the
loader reads, and in the imports type checkers read. The two must agree, and each name must load."""

from __future__ import annotations

import ast
import importlib
import inspect

import pytest


@pytest.mark.parametrize("package", ["workers.parallel", "workers.checkpointing", "workers.parallel.parameter_server"])
def test_the_typed_imports_and_the_loaders_table_name_the_same_things(package):
    module = importlib.import_module(package)
    typed: dict[str, str] = {}
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for imported in node.body:
                assert isinstance(imported, ast.ImportFrom) and imported.module
                typed |= {alias.name: imported.module.removeprefix(f"{package}.") for alias in imported.names}
    assert typed == module._HOME
    assert sorted(module.__all__) == sorted(typed)
    for name, home in typed.items():
        assert getattr(module, name) is getattr(importlib.import_module(f"{package}.{home}"), name)
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        module.nothing  # noqa: B018 - the loader's own error for a name it does not have
