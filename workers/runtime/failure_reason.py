"""A rank's failure in one line, as the group's events and errors word it."""

from __future__ import annotations

from workers.events import RestartCause
from workers.program.errors import ProgramFailed
from workers.user_model_error import UserModelError


def failure_reason(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None)
    if isinstance(cause, (UserModelError, ProgramFailed)):  # the whole message: it says what to change
        return f"UserModelError: {cause}"
    if getattr(cause, "restart_cause", None) == RestartCause.OUT_OF_MEMORY:  # the figures, whole
        return f"{type(cause).__name__}: {cause}"
    text = str(exc).strip().splitlines()
    tail = [line for line in text if line.strip()][-1:] or [type(exc).__name__]
    return f"{type(exc).__name__}: {tail[0][:300]}"
