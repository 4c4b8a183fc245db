"""Database connection errors, told apart by their type and attributes, never by the driver's text.

Two kinds: the database dropped a connection under a statement (a restart cut a pooled
connection: SQLAlchemy's DBAPIError with `connection_invalidated`), and no connection could be
made at all (the server is down or still starting: connection refused, "the database system is
starting up"). SQLAlchemy raises the second as a plain OperationalError, like many errors that
are no outage; `make_engine` installs the hook below, which raises it as DatabaseUnreachable
instead, an OperationalError still (whatever catches those catches it). SQLAlchemy tells the
case apart itself: its error context has no Connection when the error came while connecting.
"""

from __future__ import annotations

from sqlalchemy import Engine, event
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import DBAPIError, OperationalError


class DatabaseUnreachable(OperationalError):
    """Connecting to the database failed: no statement was sent, so nothing was written."""


def unreachable(driver_error: Exception) -> DatabaseUnreachable:
    """The driver's error from a failed connect (e.g. the pool's, under Engine.raw_connection)."""
    return DatabaseUnreachable(None, None, driver_error)


def raise_connect_failures_as_unreachable(engine: Engine) -> None:
    @event.listens_for(engine, "handle_error")
    def _connecting(ctx: ExceptionContext) -> DatabaseUnreachable | None:
        if ctx.connection is None and not ctx.is_pre_ping and isinstance(ctx.sqlalchemy_exception, OperationalError):
            return unreachable(ctx.original_exception)  # type: ignore[arg-type]  # a driver Error: an Exception
        return None


def lost_database(exc: BaseException) -> bool:
    """The database could not be reached, or it dropped the connection: another try may work."""
    return isinstance(exc, DatabaseUnreachable) or (isinstance(exc, DBAPIError) and exc.connection_invalidated)
