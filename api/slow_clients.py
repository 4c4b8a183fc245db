"""A bound on how long a client may take to send a request's head (uvicorn has none).

uvicorn closes idle keep-alive connections (`timeout_keep_alive`), but any byte received
cancels that timer, so a client that sends part of its headers and stalls would hold its
connection forever. This h11 protocol closes a connection whose next request head has not
fully arrived `timeout_s` after the connection opened or the previous response ended.
The request body has its own bound (api/limits.py: 408).
"""

from __future__ import annotations

from uvicorn.protocols.http.h11_impl import H11Protocol


def bounded_h11(timeout_s: float) -> type[H11Protocol]:
    class BoundedHeadH11Protocol(H11Protocol):
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
            if getattr(self, "_head_timer", None) is not None:
                self._head_timer.cancel()
            waiting_after = self.cycle  # a new request head replaces this cycle
            self._head_timer = self.loop.call_later(timeout_s, self._head_overdue, waiting_after)

        def _head_overdue(self, waiting_after) -> None:
            self._head_timer = None
            if self.cycle is waiting_after and not self.transport.is_closing():
                self.transport.close()  # no complete request head in time: hang up

    return BoundedHeadH11Protocol
