"""The keys a spec takes at one place, read from the JobSpec model itself (so an unknown key can be
answered with the closest valid one). A place is a pydantic error's location: the section names, the
union member's tag where a section has variants (`model` -> `gpt`), list indexes."""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, Tag


def keys_at(loc: Sequence[str | int]) -> list[str]:
    """The keys of the section that `loc` is inside of; [] where it is no section (a free dict, a value)."""
    from workers.spec.job import JobSpec  # job.py imports the sections that import this package's modules

    node: Any = JobSpec
    for part in loc[:-1]:
        node = _step(node, part)
        if node is None:
            return []
    sections = [t for _, t in _alternatives(node) if _is_section(t)]
    return list(sections[0].model_fields) if len(sections) == 1 else []


def _step(annotation: Any, part: str | int) -> Any:
    """The annotation one level down: the union member tagged `part`, a list's item, a section's field."""
    alternatives = _alternatives(annotation)
    for tag, t in alternatives:
        if tag is not None and tag == part:
            return t
    for _, t in alternatives:
        if isinstance(part, int) and get_origin(t) in (list, tuple):
            return get_args(t)[0]
        if _is_section(t) and part in t.model_fields:
            return t.model_fields[part].annotation
    return None


def _alternatives(annotation: Any) -> list[tuple[str | None, Any]]:
    """(tag or None, type) for each member of a union (Optional's None left out), else [(None, annotation)]."""
    if get_origin(annotation) is Annotated:
        inner, *meta = get_args(annotation)
        tag = next((m.tag for m in meta if isinstance(m, Tag)), None)
        return [(tag, inner)] if tag is not None else _alternatives(inner)
    if get_origin(annotation) in (Union, types.UnionType):
        return [alt for arg in get_args(annotation) if arg is not type(None) for alt in _alternatives(arg)]
    return [(None, annotation)]


def _is_section(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)
