"""Field errors in the spec's words: pydantic's errors become `field: rule (got value)` lines that name the
dotted field as the user wrote it (never a union member's tag or a validator's class), repeat the value
given, and answer an unknown key with the closest valid one. `format_validation_error` turns a SpecError
or a pydantic ValidationError into [{field, message}] for humans and HTTP 422."""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

from workers.spec.errors import FieldError, SpecError, Violation
from workers.spec.keys import keys_at
from workers.spec.suggest import did_you_mean

_DISCRIMINATED = {"model.name": "name", "data.name": "name", "model.hf": None}  # union error type -> key it reads
_UNION_TAGS = {"gpt", "mlp", "dlrm", "entrypoint", "hf", "text:pystdlib", "synthetic", "synthetic:clicks", "files"}
_OWN_WORDS = {"value_error", "assertion_error"}  # the project's own validators: their messages are whole
_SECTION_TYPES = {"model_type", "dict_type", "model_attributes_type"}  # "...instance of TrainSpec": a class name
_OR = {"parallel": " or 'auto'"}  # a section that also takes a word (workers/spec_loading.py)


def format_validation_error(exc: Exception) -> list[dict[str, str]]:
    """[{field, message}] for humans and HTTP 422, from a SpecError or a pydantic ValidationError."""
    if isinstance(exc, SpecError):
        out = [{"field": v.field, "message": v.message} for v in exc.violations]
    elif isinstance(exc, ValidationError):
        out = [{"field": v.field, "message": v.message} for v in field_violations(exc)]
    else:
        out = []
    unique = [dict(t) for t in dict.fromkeys(tuple(e.items()) for e in out)]
    return unique or [{"field": "", "message": str(exc)}]


def field_violations(exc: ValidationError) -> list[Violation]:
    return [field_problem(err) for err in exc.errors()]


def spec_loc(loc: Any) -> list[str | int]:
    """A pydantic location as the keys a user wrote: without the union members' tags."""
    out = list(loc)
    if len(out) > 1 and out[0] in {"model", "data"} and out[1] in _UNION_TAGS:
        del out[1]  # the union member's tag is not a field the user wrote
    if out[:2] == ["model", "hf"] and len(out) > 2 and out[2] in {"config", "pretrained"}:
        del out[2]
    return out


def dotted(loc: list[str | int]) -> str:
    """`fault_injection[0].at_step`, as the cross-field rules name list items."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")


def field_problem(err: Any) -> Violation:
    raised = (err.get("ctx") or {}).get("error")
    if isinstance(raised, FieldError):  # a field's own check names the field it is about
        return Violation(raised.field, str(raised))
    kind, given = err.get("type", ""), err.get("input")
    if kind in _DISCRIMINATED:  # a union that could not tell its member: the type names the field
        key = _DISCRIMINATED[kind]
        if key is not None and isinstance(given, dict):
            given = given.get(key)
        return Violation(kind, f"{err.get('msg', '')} (got {shown(given)})")
    field = dotted(spec_loc(err.get("loc", ())))
    rule = _rule(err, kind, given, field)
    return Violation(field, f"{field}: {rule}" if field else rule)


def _rule(err: Any, kind: str, given: Any, field: str) -> str:
    msg = err.get("msg", "")
    if kind == "extra_forbidden":
        return _unknown_key(err.get("loc", ()), field)
    if kind == "missing":
        return "is required"
    if kind in _SECTION_TYPES:
        return f"must be a mapping of keys{_OR.get(field, '')} (got {shown(given)})"
    if kind in _OWN_WORDS:
        return msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    rule = re.sub(r"^\w+ should ", "must ", msg)  # "Input should be greater than 0" -> "must be greater than 0"
    rule = re.sub(r", unable to .*$| after validation|, not \d+$", "", rule)  # the value given says it better
    return f"{rule} (got {shown(given)})"


def _unknown_key(loc: Any, field: str) -> str:
    key = str(loc[-1]) if loc else field
    parent = field[: -len(key)].rstrip(".") if field.endswith(key) else ""
    valid = keys_at(loc)
    place = f"a key of {parent}" if parent else "a top-level key of the spec"
    hint = did_you_mean(key, valid, n=1, show=lambda k: f"{parent}.{k}" if parent else k)
    if not hint and valid:
        hint = f"; the keys are {', '.join(valid)}"
    return f"is not {place}{hint}"


def shown(value: Any, limit: int = 80) -> str:
    """A value as the spec gave it, briefly: 'gpt2', -1, null, true, [1, 2]."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
