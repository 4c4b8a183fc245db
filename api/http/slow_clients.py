"""A bound on how long a client may take to send a request's head (uvicorn has none).

uvicorn closes idle keep-alive connections (`timeout_keep_alive`), but any byte received
cancels that timer, so a client that sends part of its headers and stalls would hold its
connection forever. This protocol closes a connection whose next request head has not
fully arrived `timeout_s` after the connection opened or the previous response ended.
The request body has its own bound (api/http/limits.py: 408).

A request head also has a size bound (`max_head_bytes`, 64 KiB by default, nginx's order of
magnitude): httptools has none, so a 200 KB header was parsed and answered 200 (found by the
soak, bench/soak). A head still incomplete past the bound is answered 431 and the connection
closed, before the parser buffers more of it.

It wraps uvicorn's httptools protocol (C parser, several times cheaper per request than
h11) when httptools is installed, else the pure-Python h11 one; both make a new `cycle`
once a request head is complete, which is what the timer watches for.
"""

from __future__ import annotations

import json

MAX_HEAD_BYTES = 64 * 1024

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Base
except ImportError:  # pragma: no cover - httptools ships with uvicorn[standard]
    from uvicorn.protocols.http.h11_impl import H11Protocol as _Base


def _too_large(max_head_bytes: int) -> bytes:
    message = f"request head (request line and headers) over {max_head_bytes} bytes"
    body = json.dumps({"detail": message, "errors": [{"field": "headers", "message": message}]}).encode()
    return (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)) + body


def bounded_http(timeout_s: float, max_head_bytes: int = MAX_HEAD_BYTES) -> type[_Base]:
    class BoundedHeadProtocol(_Base):
        _head_timer = None
        _head_cycle = None
        _head_bytes = 0

        def data_received(self, data: bytes) -> None:
            if self._head_timer is not None and self.cycle is self._head_cycle:  # a request head is due
                # count only up to the head's end: a busy server may read a head and its body in one chunk
                end = data.find(b"\r\n\r\n")
                self._head_bytes += len(data) if end < 0 else end
                if self._head_bytes > max_head_bytes:
                    self._head_timer.cancel()
                    self._head_timer = None
                    self.transport.write(_too_large(max_head_bytes))
                    self.transport.close()
                    return
            super().data_received(data)

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_head_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_head_timer()

        def connection_lost(self, exc) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            super().connection_lost(exc)

        def _arm_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            waiting_after = self._head_cycle = self.cycle  # a new request head replaces this cycle
            self._head_bytes = 0
            self._head_timer = self.loop.call_later(timeout_s, self._head_overdue, waiting_after)

        def _head_overdue(self, waiting_after) -> None:
            self._head_timer = None
            if self.cycle is waiting_after and not self.transport.is_closing():
                self.transport.close()  # no complete request head in time: hang up

    return BoundedHeadProtocol
