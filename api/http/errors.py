"""Error mapping: every failure leaves as JSON {"detail": message, "errors": [{field, message}]}.

Bad input is always a 4xx naming the field and the rule; an unexpected server
fault is a logged 500 without internals (api/http/server_errors.py: not an exception
handler here, as Starlette re-raises after those and the server then drops the connection);
a database that is down or restarting is a 503 with Retry-After (api/http/database_outage.py).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from sqlalchemy.exc import DataError
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.lifecycle import IllegalTransition
from service.refusals import Conflict, InvalidRequest, NotAllowed, OverQuota, Refusal, TooLarge, Unauthenticated
from workers.spec import SpecError, format_validation_error

INTERNAL_ERROR = "internal error; see the service log"  # the whole 500 message: no internals leak


class ApiError(Exception):
    def __init__(self, status: int, message: str, errors: list[dict] | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.errors, self.headers = status, message, errors or [], headers


def error_response(status: int, message: str, errors: list[dict] | None = None, headers=None) -> JSONResponse:
    return JSONResponse({"detail": message, "errors": errors or []}, status_code=status, headers=headers)


# A service refusal's kind -> its status and extra headers (the first class it is an instance of).
REFUSAL_STATUS: tuple[tuple[type[Refusal], int, dict | None], ...] = (
    (Unauthenticated, 401, {"WWW-Authenticate": "Bearer"}), (NotAllowed, 403, None), (InvalidRequest, 422, None),
    (Conflict, 409, None), (TooLarge, 413, None),
    (OverQuota, 429, {"Retry-After": "30"}),  # a quota frees up as jobs finish
)


def refusal_response(exc: Refusal) -> JSONResponse:
    status, headers = next(((code, h) for kind, code, h in REFUSAL_STATUS if isinstance(exc, kind)), (400, None))
    errors = [{"field": exc.field, "message": exc.rule}] if exc.field else []
    return error_response(status, exc.message, errors, headers)


def _request_validation(_: Request, exc: RequestValidationError) -> JSONResponse:
    errors = []
    for e in exc.errors():
        field = ".".join(str(p) for p in e.get("loc", ()) if p not in ("body",)) or "body"
        errors.append({"field": field, "message": f"{field}: {e.get('msg', 'invalid')}"})
    return error_response(422, "; ".join(e["message"] for e in errors), errors)


def _spec_validation(_: Request, exc: ValidationError | SpecError) -> JSONResponse:
    errors = format_validation_error(exc)
    return error_response(422, "invalid job spec: " + "; ".join(e["message"] for e in errors), errors)


def install_error_handlers(app: FastAPI) -> None:
    from api.http.error_schema import install_error_schema

    install_error_schema(app)  # the OpenAPI document declares these answers
    app.add_exception_handler(RequestValidationError, _request_validation)
    app.add_exception_handler(ValidationError, _spec_validation)
    app.add_exception_handler(SpecError, _spec_validation)

    @app.exception_handler(ApiError)
    def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.errors, exc.headers)

    @app.exception_handler(IllegalTransition)
    def _illegal(_: Request, exc: IllegalTransition) -> JSONResponse:
        return error_response(409, str(exc), [{"field": "state", "message": str(exc)}])

    app.add_exception_handler(Refusal, lambda _, exc: refusal_response(exc))

    @app.exception_handler(DataError)
    def _data(_: Request, exc: DataError) -> JSONResponse:
        # The database refused a value the request carried (a NUL character in a string, a number
        # out of its range): bad input, never a 500. Nothing was written (the transaction rolled back).
        reason = str(exc.orig).splitlines()[0] if exc.orig is not None else "invalid value"
        msg = f"input: a value cannot be stored ({reason}); remove NUL characters and keep numbers in range"
        return error_response(422, msg, [{"field": "body", "message": msg}])

    @app.exception_handler(StarletteHTTPException)
    def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))
