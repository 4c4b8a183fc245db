"""Whether an ASGI response has begun: after `http.response.start` a middleware can no longer
answer in its place (an error status would be a second response on the connection)."""

from __future__ import annotations


class ResponseTracker:
    """Wraps `send`; `started` turns True once the response's start has been sent."""

    def __init__(self, send):
        self._send = send
        self.started = False

    async def __call__(self, message) -> None:
        self.started = self.started or message["type"] == "http.response.start"
        await self._send(message)
