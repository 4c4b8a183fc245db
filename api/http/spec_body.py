"""A request body that carries a job spec (POST /v1/jobs, POST /v1/plans): read as one JSON object."""

from __future__ import annotations

import json

from api.http.errors import ApiError


def decode_spec_body(body: bytes) -> dict:
    """The decoded object; ApiError(422) naming the body for malformed JSON or a non-object."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        msg = f"body: malformed JSON ({exc})"
        raise ApiError(422, msg, [{"field": "body", "message": msg}]) from None
    if not isinstance(data, dict):
        msg = f"body: a job spec must be a JSON object, got {type(data).__name__}"
        raise ApiError(422, msg, [{"field": "body", "message": msg}])
    return data
