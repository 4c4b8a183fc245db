"""A placement group's name says which supervisor owns it (workers/runtime/group_owner.py): the
control plane removes the groups Ray leaks by it, and the scheduler counts a job's groups by it."""

from __future__ import annotations

import pytest

from workers.runtime.group_owner import GroupOwner


def test_the_same_attempt_of_one_job_gets_two_names_that_name_its_owner():
    # Two supervisors of one job (a lost one, not yet cleaned up, and its replacement) at the same
    # attempt: a duplicate name failed the job at once (found by the soak).
    owner = GroupOwner("abc", 3)
    first, second = owner.group_name(0), owner.group_name(0)
    assert first != second and first.startswith("ty-abc-pg-3-0-")
    assert GroupOwner.of_group(first) == GroupOwner.of_group(second) == owner


@pytest.mark.parametrize("job_id", ["0123456789abcdef", "test_a-pg-b0", "clean"])
def test_a_job_id_with_dashes_or_the_mark_itself_comes_back_whole(job_id):
    assert GroupOwner.of_group(GroupOwner(job_id, 12).group_name(7)) == GroupOwner(job_id, 12)


@pytest.mark.parametrize("name", ["", "x", "ty-abc", "ty-abc-pg-0-1ab2c3d4", "other-abc-pg-0-0-1ab2c3d4",
                                  "ty-abc-pg-x-0-1ab2c3d4", "ty-abc-pg-0-0-1-2"])
def test_a_name_this_module_did_not_make_names_no_owner(name):
    assert GroupOwner.of_group(name) is None
