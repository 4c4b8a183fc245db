"""The step a job's next attempt resumes from: its newest complete checkpoint.

Trainyard's own loop keeps DCP checkpoints (`checkpoints/step-N/`); a program keeps its own files in
the same directory (`trainyard.latest_checkpoint()` finds them). A supervisor restarting its group and
the reconciler replacing a lost supervisor must agree on it, so both ask here.
"""

from __future__ import annotations

from collections.abc import Callable

from trainyard.checkpoints import complete_checkpoints_in
from workers.checkpointing import latest_checkpoint
from workers.checkpointing.retry import RetryPolicy, with_retries
from workers.events import RunEvent
from workers.events.store_events import SUPERVISOR
from workers.program.environment import checkpoint_dir
from workers.storage import Storage


def resume_step(job: Storage, is_program: bool) -> int:
    """0 when there is none (the attempt starts from scratch)."""
    if is_program:
        done = complete_checkpoints_in(checkpoint_dir(job).uri)
        return done[-1][0] if done else 0
    latest = latest_checkpoint(job)  # an incomplete newer one: rank 0 reports it when it loads
    return latest[0] if latest else 0


def resume_step_riding_outages(job: Storage, is_program: bool, notify: Callable[[RunEvent], None],
                               policy: RetryPolicy | None = None) -> int:
    """resume_step, retried as the ranks retry their writes: a rank that failed because the store went
    away leaves a supervisor that must read the same store. StoreUnavailable past the policy's limit."""
    return with_retries(lambda: resume_step(job, is_program), "listing checkpoints", SUPERVISOR,
                        policy or RetryPolicy.from_env(), notify)
