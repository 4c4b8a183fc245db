"""Who a placement group belongs to, written into its name: the job and the supervisor's epoch.

A placement group lives as long as the supervisor actor that created it, but Ray leaks it when
that actor is killed while the group is being created (measured here: 9 of 60 kills within
~50 ms of `placement_group()` left the group CREATED for good). The control plane finds such
groups by their owner (service/leaked_groups.py); Ray's table has the name, not the creator.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

PREFIX = "ty-"
GROUP_MARK = "-pg-"


@dataclass(frozen=True)
class GroupOwner:
    """A job's supervisor: `epoch` 0 for `trainyard run` and direct runs, the job's
    `supervisor_epoch` under the service."""

    job_id: str
    epoch: int = 0

    def group_name(self, attempt: int) -> str:
        """`ty-{job}-pg-{epoch}-{attempt}-{nonce}`. The nonce: a replacement supervisor starts again at
        the same attempt while the lost one's group may still exist, and a duplicate name failed
        the job at once (found by the soak)."""
        return f"{PREFIX}{self.job_id}{GROUP_MARK}{self.epoch}-{attempt}-{uuid.uuid4().hex[:8]}"

    @staticmethod
    def of_group(name: str) -> GroupOwner | None:
        """The owner named in a group's name; None for a group this module did not name."""
        head, mark, tail = name.rpartition(GROUP_MARK)
        parts = tail.split("-")
        if not (mark and head.startswith(PREFIX) and len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit()):
            return None
        return GroupOwner(head.removeprefix(PREFIX), int(parts[0]))
