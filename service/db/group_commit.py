"""Group commit: the small write transactions of concurrent requests (job submits, audit records)
run together, one transaction per batch, on one writer thread.

Under load most of a small transaction's cost is fixed (the write lock, BEGIN, COMMIT, the
session): a batch pays it once. Each write is a function of the open session that checks first
and then writes (ORM objects), so an exception it raises (a quota, a conflict) usually has
written nothing: it goes to its own caller and the batch goes on. A write that raises after it
added, changed or flushed an object instead fails the batch, like a failure at flush or commit
(e.g. a unique key another process took meanwhile): the batch is rolled back and its writes are
retried one per transaction, so each caller gets its own outcome and no half of a refused write
is committed. A caller is answered only after its write is committed.

`prepare(session, hints)`, if given, runs first in each batch's transaction with the hints its
writes came with: it does at once what the writes would each do alone (for submits: lock the
tenants and read their usage, look up the idempotency keys), which saves round trips.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from sqlalchemy import event
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from service.db.engine import Sessions

log = logging.getLogger("trainyard.db")
MAX_BATCH = 64


class GroupCommit:
    def __init__(self, sessions: Sessions, name: str = "trainyard-writer",
                 prepare: Callable[[Any, list], None] | None = None):
        self.sessions, self.prepare = sessions, prepare
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, write: Callable[[Any], Any], lock_order: str = "", hint: Any = None) -> Future:
        """write(session) -> result, run in a batch transaction; the future resolves after commit.
        A batch runs its writes sorted by `lock_order` (the key of the row lock a write takes, e.g.
        its tenant), so concurrent batches on other replicas lock in the same order: no deadlock.
        `hint` (not None) goes to `prepare`."""
        future: Future = Future()
        self._queue.put((lock_order, write, future, hint))
        return future

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch = [item]
            while len(batch) < MAX_BATCH:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)  # finish this batch, then stop
                    break
                batch.append(item)
            try:
                self._commit(batch)
            except Exception as exc:  # noqa: BLE001 - the batch failed as a whole: one by one
                if len(batch) == 1:
                    _fail(batch[0][2], exc)
                    continue
                log.info("a batch of %d writes failed (%s); retrying each alone", len(batch), exc)
                for one in batch:
                    try:
                        self._commit([one])
                    except Exception as exc_one:  # noqa: BLE001
                        _fail(one[2], exc_one)

    def _commit(self, batch: list) -> None:
        done: list[tuple[Future, Any]] = []
        with self.sessions.begin() as s:
            flushed: set[int] = set()
            event.listen(s, "before_flush", lambda session, *_: flushed.update(_pending(session)))
            hints = [item[3] for item in batch if item[3] is not None and not item[2].done()]
            if self.prepare and hints:
                self.prepare(s, hints)
            for _, write, future, _ in sorted(batch, key=lambda item: item[0]):  # stable: FIFO per key
                if future.done():  # answered by an earlier try of this batch
                    continue
                before = _pending(s) | flushed
                try:
                    done.append((future, write(s)))
                except SQLAlchemyError:  # the session may hold half a write: the batch as a whole fails
                    raise
                except Exception as exc:
                    if (_pending(s) | flushed) - before:  # it wrote, then refused: roll all of it back
                        raise HalfWritten(exc) from exc
                    _fail(future, exc)  # the write's own refusal: it wrote nothing
        for future, result in done:  # committed
            future.set_result(result)


class HalfWritten(Exception):
    """A write raised after it had written: its batch is rolled back, its caller gets `refusal`."""

    def __init__(self, refusal: Exception):
        super().__init__(f"a write refused after writing: {refusal!r}")
        self.refusal = refusal


def _pending(s: Session) -> set[int]:
    """The objects this transaction will write (or wrote: collected before each flush)."""
    return {id(obj) for obj in (*s.new, *s.dirty, *s.deleted)}


def _fail(future: Future, exc: BaseException) -> None:
    if isinstance(exc, HalfWritten):
        exc = exc.refusal
    if not future.done():
        future.set_exception(exc)
