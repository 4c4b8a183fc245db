"""A PostgreSQL that takes a connection and never answers (a hung server, a host dropping packets
behind a proxy) fails a connect within the engine's bound, as DatabaseUnreachable: a request then
waits out the outage on its own deadline (TRAINYARD_DB_UNAVAILABLE_WAIT_S) and answers 503, instead
of hanging on the kernel's TCP timeouts."""

from __future__ import annotations

import socket
import time

import pytest

from service.db.connection_errors import DatabaseUnreachable
from service.db.engine import PG_CONNECT_TIMEOUT_S, make_engine


def test_a_connect_to_a_silent_server_fails_within_the_bound():
    with socket.socket() as silent:  # the kernel completes the handshake; no one ever reads or writes
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        engine = make_engine(f"postgresql+psycopg://trainyard@127.0.0.1:{silent.getsockname()[1]}/trainyard")
        started = time.monotonic()
        with pytest.raises(DatabaseUnreachable):
            engine.connect()
        took = time.monotonic() - started
        engine.dispose()
    assert PG_CONNECT_TIMEOUT_S - 1 <= took < PG_CONNECT_TIMEOUT_S * 2 + 1, took
