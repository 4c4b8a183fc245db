"""The rest of a spec whose fields have errors: so that one answer names the field errors and the
cross-field rules the other fields break (a user fixes a spec in one round, not two).

Each field in error is left out, so that its default applies (a list or a section's variant goes whole),
until the spec validates; a cross-field rule is then reported only when it names none of the sections a
field was left out of (a default standing in for the user's value must not cause a complaint of its own)."""

from __future__ import annotations

import copy
import re
from typing import Any

from pydantic import ValidationError

from workers.spec import JobSpec, Violation
from workers.spec.messages import dotted, spec_loc

_ROUNDS = 4  # a removal can expose a required key's absence: its parent goes next round


def spec_without(data: Any, exc: ValidationError) -> tuple[JobSpec | None, list[str]]:
    """The spec validated with the fields in error left out, and the sections they were left out of;
    (None, ...) when it cannot be made valid that way (a required top-level key, say)."""
    if not isinstance(data, dict):
        return None, []
    data = copy.deepcopy(data)
    removed: list[list[str | int]] = []
    for _ in range(_ROUNDS):
        for err in exc.errors():
            path = _removable(spec_loc(err.get("loc", ())), err.get("type") == "missing")
            if any(path[:len(gone)] == gone for gone in removed):
                continue  # inside what an earlier error's removal took
            if not path or not _remove(data, path):
                return None, []
            removed.append(path)
        try:
            return JobSpec.model_validate(data), [dotted(_scope(path)) for path in removed]
        except ValidationError as again:
            exc = again
    return None, []


def unaffected(violations: list[Violation], removed: list[str]) -> list[Violation]:
    """The violations that name no section a field was left out of, neither as their own field nor in
    their message."""
    return [v for v in violations if not any(_names(v, field) for field in removed)]


def _names(v: Violation, field: str) -> bool:
    if v.field == field or v.field.startswith((f"{field}.", f"{field}[")) or field.startswith(f"{v.field}."):
        return True
    return re.search(rf"(?<![\w.]){re.escape(field)}(?!\w)", v.message) is not None


def _scope(path: list[str | int]) -> list[str | int]:
    """The section a field left out belongs to: its defaults stand in for the user's value there, and
    an unknown key there may be a known one mistyped (the rules of that section cannot be trusted)."""
    return path[:-1] if len(path) > 1 else path


def _removable(path: list[str | int], missing: bool) -> list[str | int]:
    """What to leave out for an error at `path`: up to a list as a whole (its items are numbered), and
    a missing key's parent (nothing to remove at the key itself)."""
    index = next((i for i, p in enumerate(path) if isinstance(p, int)), None)
    if index is not None:
        path = path[:index]
    return path[:-1] if missing else path


def _remove(data: dict, path: list[str | int]) -> bool:
    node: Any = data
    for part in path[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict) or path[-1] not in node:
        return False
    del node[path[-1]]
    return True
