"""Why a submit (or another change) is refused, as typed values the API maps to HTTP answers.

Each refusal carries `field` (the request field at fault, dotted; None when no one field is),
`rule` (the rule it breaks, a sentence naming the field) and `message` (the answer's summary;
the rule unless a refusal words it more fully). The class says what kind of refusal it is:
the API maps the class to a status code (api/http/errors.py), never the text.
"""

from __future__ import annotations


class Refusal(Exception):
    def __init__(self, rule: str, field: str | None = None, message: str | None = None):
        super().__init__(message or rule)
        self.rule, self.field, self.message = rule, field, message or rule


class Unauthenticated(Refusal):
    """The token no longer names a caller the service knows (its tenant is gone since it was cached)."""


class NotAllowed(Refusal):
    """The tenant or the token may not ask for this (user code, fault injection)."""


class InvalidRequest(Refusal):
    """The spec breaks a rule only the service can check (a path outside the storage root)."""


class NeverFits(InvalidRequest):
    """The job could never run: more than the cluster has, or than the tenant may ever hold."""


class TooLarge(Refusal):
    """The request carries more than a configured limit allows (an uploaded zip over TRAINYARD_MAX_CODE_BYTES)."""


class OverQuota(Refusal):
    """A quota is full now; the same submit may pass later."""


class Conflict(Refusal):
    """The request collides with what is stored (an idempotency key reused for another body, a name taken)."""
