"""How a spec is refused: every problem names the dotted field to change.

Field-level checks raise inside pydantic (a ValidationError); the rules that span fields
return Violations, raised together as one SpecError. `format_validation_error` turns
either into [{field, message}] for humans and HTTP 422.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError


@dataclass(frozen=True)
class Violation:
    """One broken rule: the field to change and the whole message (it starts with the field)."""
    field: str
    message: str


class SpecError(ValueError):
    """A spec that breaks rules spanning several fields (or no layout fits)."""

    def __init__(self, violations: list[Violation]):
        super().__init__("\n".join(v.message for v in violations))
        self.violations = tuple(violations)


SPEC_ERRORS = (ValidationError, SpecError)  # what loading a submitted spec may raise


class FieldError(ValueError):
    """An error raised inside a field's own check that names the dotted spec field; the message starts with it."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


_DISCRIMINATED = {"model.name", "data.name", "model.hf"}  # the custom_error_type of each tagged union
_UNION_TAGS = {"gpt", "mlp", "entrypoint", "hf", "text:pystdlib", "synthetic", "files"}


def format_validation_error(exc: Exception) -> list[dict[str, str]]:
    """[{field, message}] for humans and HTTP 422, from a SpecError or a pydantic ValidationError."""
    if isinstance(exc, SpecError):
        out = [{"field": v.field, "message": v.message} for v in exc.violations]
    elif isinstance(exc, ValidationError):
        out = [_field_problem(err) for err in exc.errors()]
    else:
        out = []
    unique = [dict(t) for t in dict.fromkeys(tuple(e.items()) for e in out)]
    return unique or [{"field": "", "message": str(exc)}]


def _field_problem(err: Any) -> dict[str, str]:
    raised = (err.get("ctx") or {}).get("error")
    if isinstance(raised, FieldError):  # a field's own check names the field it is about
        return {"field": raised.field, "message": str(raised)}
    if err.get("type") in _DISCRIMINATED:  # a union that could not tell its member: the type names the field
        return {"field": err["type"], "message": err.get("msg", "")}
    loc = list(err.get("loc", ()))
    if len(loc) > 1 and loc[0] in {"model", "data"} and loc[1] in _UNION_TAGS:
        del loc[1]  # the union member's tag is not a field the user wrote
    if loc[:2] == ["model", "hf"] and len(loc) > 2 and loc[2] in {"config", "pretrained"}:
        del loc[2]
    field = ".".join(str(p) for p in loc)
    msg = err.get("msg", "").removeprefix("Value error, ")
    return {"field": field, "message": f"{field}: {msg}" if field else msg}
