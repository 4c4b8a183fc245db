"""What every DDP communication hook of this package keeps: the job's comm meter and where its bytes go.

Its own module so that the flat hooks (compression.py) and the hierarchical one (hierarchical.py), which
builds on it, both import it without importing each other.
"""

import weakref

import torch

from workers.telemetry import CommMeter


class MeteredState:
    def __init__(self, meter: CommMeter, inner=None):
        self.meter, self.inner = meter, inner
        self.crosses = False  # this rank's ring successor is on another node: what it sends crosses nodes
        self.previous: torch.futures.Future | None = None
        # The DDP module whose buckets the hook sees (peak-memory accounting); weak: DDP's C++ reducer holds
        # this state, and a cycle through C++ would never be collected.
        self.owner: weakref.ref = weakref.ref(self)
