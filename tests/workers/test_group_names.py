"""Two supervisors of one job (a lost one, not yet cleaned up, and its replacement) at the same attempt
name their placement groups apart, both under the job's prefix the scheduler counts by (found by the
soak: the replacement's `ty-<job>-pg-0` already existed and the job FAILED at once)."""

from __future__ import annotations

from workers.runtime.group import pg_name


def test_the_same_attempt_of_one_job_gets_two_names_under_its_prefix():
    first, second = pg_name("ty-abc", 0), pg_name("ty-abc", 0)
    assert first != second
    assert first.startswith("ty-abc-pg-0-") and second.startswith("ty-abc-pg-0-")
