"""Writes to a store that may go away for a while: bounded exponential backoff, then a clear failure.

A store outage must neither lose training nor hang a job: a checkpoint write that fails is retried
(each retry reported as an event) until TRAINYARD_STORE_RETRY_S has passed, then StoreUnavailable
fails the job with that cause (not retryable: a restart would wait on the same store).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from workers.events import RestartCause, RunEvent, StoreRecoveredEvent, StoreRetryEvent
from workers.storage.client_env import RETRY_ENV

T = TypeVar("T")
DEFAULT_LIMIT_S = 120.0


class StoreUnavailable(RuntimeError):
    """The store did not answer within the retry limit."""

    retryable = False  # workers/runtime/group.py: the job fails instead of restarting
    restart_cause = RestartCause.STORAGE


@dataclass(frozen=True)
class RetryPolicy:
    limit_s: float = DEFAULT_LIMIT_S  # give up once retrying would pass this long
    first_delay_s: float = 0.5
    max_delay_s: float = 8.0

    @classmethod
    def from_env(cls) -> RetryPolicy:
        raw = os.environ.get(RETRY_ENV, "")
        try:
            limit = float(raw) if raw else DEFAULT_LIMIT_S
        except ValueError:
            raise ValueError(f"{RETRY_ENV}: not a number of seconds (got {raw!r})") from None
        if limit < 0:
            raise ValueError(f"{RETRY_ENV}: must be >= 0 (got {raw!r})")
        return cls(limit_s=limit)


def with_retries(write: Callable[[], T], what: str, rank: int, policy: RetryPolicy,
                 notify: Callable[[RunEvent], None], sleep: Callable[[float], None] = time.sleep) -> T:
    """`write()`, retried on any error until `policy.limit_s`; each retry and the recovery are reported."""
    start, delay, retries = time.monotonic(), policy.first_delay_s, 0
    while True:
        try:
            result = write()
        except StoreUnavailable:
            raise
        except Exception as exc:
            elapsed = time.monotonic() - start
            error = f"{type(exc).__name__}: {exc}"[:300]
            if elapsed + delay > policy.limit_s:
                raise StoreUnavailable(f"{what}: the storage did not answer for {elapsed:.0f}s "
                                       f"({RETRY_ENV}={policy.limit_s:g}); last error {error}") from exc
            retries += 1
            notify(StoreRetryEvent(rank, what, retries, delay, error))
            sleep(delay)
            delay = min(delay * 2, policy.max_delay_s)
            continue
        if retries:
            notify(StoreRecoveredEvent(rank, what, retries, time.monotonic() - start))
        return result
