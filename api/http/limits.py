"""Request body limits as plain ASGI middleware: size (413, before the body is read or parsed)
and read time (408 for a client that sends its headers and then stalls, or trickles its body).

One limit for every route (JSON bodies), and larger ones for the routes that take files (a
code upload, POST /v1/code): such a route's body gets its own size limit, and its read time grows
with the body's size (declared, else the limit) at a minimum transfer rate.

The read-time bound covers only the request body: once it is complete, later `receive`
calls (a streaming response listening for the client's disconnect) wait without limit.
A JSON body's nesting depth has its own bound, inside these (api/http/json_depth.py: 422).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import anyio

from api.http.response_tracker import ResponseTracker


@dataclass(frozen=True)
class BodyLimit:
    max_bytes: int
    read_timeout_s: float | None = None
    setting: str = "TRAINYARD_MAX_BODY_BYTES"  # named in the 413, so a user knows what to raise
    min_bytes_per_s: float | None = None  # a large body gets (its size / this) longer than read_timeout_s

    def read_time_s(self, declared: int | None) -> float | None:
        if self.read_timeout_s is None:
            return None
        if not self.min_bytes_per_s:
            return self.read_timeout_s
        return self.read_timeout_s + (self.max_bytes if declared is None else declared) / self.min_bytes_per_s


class BodyRejected(Exception):
    def __init__(self, status: int):
        self.status = status


class BodyLimitMiddleware:
    """`routes`: exact paths with a limit of their own instead of the default one."""

    def __init__(self, app, max_bytes: int, read_timeout_s: float | None = None,
                 routes: dict[str, BodyLimit] | None = None):
        self.app, self.default, self.routes = app, BodyLimit(max_bytes, read_timeout_s), routes or {}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.routes.get(scope["path"], self.default)
        declared: int | None = None
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    return await self._reject(send, 400, "content-length: not an integer")
                if declared > limit.max_bytes:
                    return await self._reject(send, 413, self._message(limit, declared))
        received = 0
        body_done = False
        read_time_s = limit.read_time_s(declared)
        deadline = anyio.current_time() + read_time_s if read_time_s else None

        async def limited_receive():
            nonlocal received, body_done
            if body_done or deadline is None:
                message = await receive()
            else:
                try:
                    with anyio.fail_after(max(deadline - anyio.current_time(), 0.05)):
                        message = await receive()
                except TimeoutError:
                    raise BodyRejected(408) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                body_done = not message.get("more_body", False)
                if received > limit.max_bytes:
                    raise BodyRejected(413)
            return message

        tracked = ResponseTracker(send)
        try:
            await self.app(scope, limited_receive, tracked)
        except BodyRejected as exc:
            if tracked.started:  # the answer is already on its way; nothing more to say
                return
            if exc.status == 413:
                await self._reject(send, 413, self._message(limit, received))
            else:
                await self._reject(send, 408, f"body: the request body was not received within "
                                              f"{read_time_s:g} s ({received} bytes arrived)")

    @staticmethod
    def _message(limit: BodyLimit, size: int) -> str:
        return (f"body: request body of {size} bytes or more is over the limit of {limit.max_bytes} bytes "
                f"({limit.setting})")

    async def _reject(self, send, status: int, message: str) -> None:
        body = json.dumps({"detail": message, "errors": [{"field": "body", "message": message}]}).encode()
        # Connection: close, as the rest of the body may still be on its way: the server hangs up.
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
