"""The scheduler's queueing policy, pure: per-tenant queues, weighted fair share, backfill, reservations.

No database, no cluster, no torch: plain frozen rows in (`rows.py`), an in-memory index of the
queue kept up to date by events (`index.py`), and one planning function that returns typed
decisions (`policy.py`). The scheduler (service/scheduler.py) feeds it from the database
(service/queue_feed.py) and carries out what it decides. docs/scale.md explains the policy.
"""

from service.queueing.index import QueueIndex
from service.queueing.policy import Plan, Reservation, Waiting, plan
from service.queueing.rows import QueuedJob, Resources, TenantState

__all__ = ["Plan", "QueueIndex", "QueuedJob", "Reservation", "Resources", "TenantState", "Waiting", "plan"]
