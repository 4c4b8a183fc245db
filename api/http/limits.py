"""Request body limits as plain ASGI middleware: size (413, before the body is read or parsed)
and read time (408 for a client that sends its headers and then stalls, or trickles its body).

The read-time bound covers only the request body: once it is complete, later `receive`
calls (a streaming response listening for the client's disconnect) wait without limit.
"""

from __future__ import annotations

import json

import anyio


class BodyRejected(Exception):
    def __init__(self, status: int):
        self.status = status


class BodyLimitMiddleware:
    def __init__(self, app, max_bytes: int, read_timeout_s: float | None = None):
        self.app, self.max_bytes, self.read_timeout_s = app, max_bytes, read_timeout_s

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
        body_done = False
        deadline = anyio.current_time() + self.read_timeout_s if self.read_timeout_s else None

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
                if received > self.max_bytes:
                    raise BodyRejected(413)
            return message

        async def tracking_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyRejected as exc:
            if started:  # the answer is already on its way; nothing more to say
                return
            if exc.status == 413:
                await self._reject(send, 413, self._message(received))
            else:
                await self._reject(send, 408, f"body: the request body was not received within "
                                              f"{self.read_timeout_s:g} s ({received} bytes arrived)")

    def _message(self, size: int) -> str:
        return f"body: request body of {size} bytes or more is over the limit of {self.max_bytes} bytes"

    async def _reject(self, send, status: int, message: str) -> None:
        body = json.dumps({"detail": message, "errors": [{"field": "body", "message": message}]}).encode()
        # Connection: close, as the rest of the body may still be on its way: the server hangs up.
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
