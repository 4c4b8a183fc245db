"""Per-token rate limit: a token bucket per token id, in this replica's memory.

Each token gets `burst` requests at once and `rate` more per second after that; a request
that finds the bucket empty gets 429 with Retry-After. With two replicas a token gets up to
twice the rate (each replica limits what it serves).
"""

from __future__ import annotations

import threading
import time


class TokenBuckets:
    def __init__(self, rate: float, burst: int):
        self.rate, self.burst = rate, max(1, burst)
        self._buckets: dict[int, tuple[float, float]] = {}  # token id -> (tokens left, at monotonic time)
        self._lock = threading.Lock()

    def take(self, key: int) -> float | None:
        """Spend one request; None if allowed, else the seconds until one is allowed."""
        now = time.monotonic()
        with self._lock:
            tokens, at = self._buckets.get(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.rate)
            if tokens < 1.0:
                self._buckets[key] = (tokens, now)
                return (1.0 - tokens) / self.rate
            self._buckets[key] = (tokens - 1.0, now)
            return None
