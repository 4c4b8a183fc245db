"""Request body size limit as plain ASGI middleware: 413 before the body is read or parsed."""

from __future__ import annotations

import json


class BodyTooLarge(Exception):
    pass


class BodyLimitMiddleware:
    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    return await self._reject(send, 400, "content-length: not an integer")
                if declared > self.max_bytes:
                    return await self._reject(send, 413, self._message(declared))
        received = 0
        started = False

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge()
            return message

        async def tracking_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await self._reject(send, 413, self._message(received))

    def _message(self, size: int) -> str:
        return f"body: request body of {size} bytes or more is over the limit of {self.max_bytes} bytes"

    async def _reject(self, send, status: int, message: str) -> None:
        body = json.dumps({"detail": message, "errors": [{"field": "body", "message": message}]}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
