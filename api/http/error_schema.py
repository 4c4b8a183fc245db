"""The OpenAPI document states what api/http/errors.py sends: every error is an ErrorOut.

FastAPI documents only the success answer and its own 422 shape. Clients (and the
schemathesis fuzz test) need the truth: bearer auth on /v1, and the 4xx answers
each route can give (and the database outage's 503), all with the one error body. Added to the generated document
in one place rather than repeated on every route.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field


class ErrorItem(BaseModel):
    field: str = Field(description="the request field at fault (dotted path), or 'body'")
    message: str = Field(description="what is wrong with it and the rule it breaks")


class ErrorOut(BaseModel):
    detail: str = Field(description="a readable summary naming the field and the rule")
    errors: list[ErrorItem] = Field(default_factory=list)


EVERY_ROUTE = {  # the body-limit and nesting middlewares and the server's timeouts apply before any route
    400: "malformed request framing (e.g. a Content-Length that is not a number)",
    408: "the request body did not arrive in time",
    413: "request body over the configured limit",
    422: "invalid input: the message names the field and the rule (also: a JSON body nested too deep)",
}
V1_ROUTES = {
    401: "missing, malformed, unknown, expired or revoked bearer token",
    403: "the token lacks the scope this call needs",
    404: "no such resource for this tenant",
    409: "conflict: illegal state transition, idempotency key reused with another body, name taken",
    429: "over a quota or the rate limit (see Retry-After)",
    503: "the database is unavailable (down or restarting; see Retry-After)",
}


def _error(description: str) -> dict:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}}}


def install_error_schema(app: FastAPI) -> None:
    def openapi() -> dict:
        if app.openapi_schema:
            return app.openapi_schema
        doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        schemas["ErrorOut"] = ErrorOut.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schemas["ErrorOut"].pop("$defs", {}))
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        for path, operations in doc["paths"].items():
            for op in operations.values():
                codes = dict(EVERY_ROUTE)
                if path.startswith("/v1/"):
                    codes |= V1_ROUTES
                    op["security"] = [{"bearer": []}]
                for code, description in codes.items():
                    op["responses"][str(code)] = _error(description)  # replaces FastAPI's own 422 shape
        app.openapi_schema = doc
        return doc

    app.openapi = openapi
