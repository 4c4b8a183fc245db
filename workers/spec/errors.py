"""How a spec is refused: every problem names the dotted field to change.

Field-level checks raise inside pydantic (a ValidationError); the rules that span fields
return Violations. A submitted spec's field errors and the cross-field rules its other fields break
are raised together as one SpecError (workers/spec_checks.py). `format_validation_error`
(messages.py) turns either into [{field, message}] for humans and HTTP 422.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError


@dataclass(frozen=True)
class Violation:
    """One broken rule: the field to change and the whole message (it starts with the field)."""
    field: str
    message: str


class SpecError(ValueError):
    """A refused spec: the rules spanning several fields it breaks (or no layout fits), and with them, for
    a submitted spec, its fields' own errors."""

    def __init__(self, violations: list[Violation]):
        super().__init__("\n".join(v.message for v in violations))
        self.violations = tuple(violations)


SPEC_ERRORS = (ValidationError, SpecError)  # what loading a submitted spec may raise


class FieldError(ValueError):
    """An error raised inside a field's own check that names the dotted spec field; the message starts with it."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
