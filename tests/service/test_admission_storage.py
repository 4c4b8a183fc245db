"""Storage paths in a spec confined under an object-store root (service/admission/gates.py), on a real
S3 API: a path relative to the root becomes its full URI, a URI under the root stays, anything else is
refused naming the field."""

from __future__ import annotations

import pytest

from service.admission.gates import confine_paths
from service.refusals import InvalidRequest
from workers.spec import JobSpec
from workers.storage import Storage

PROGRAM = {"name": "prog", "program": {"command": ["python", "train.py"]}, "resources": {"workers": 1}}


@pytest.fixture(scope="module")
def root(s3_server) -> Storage:
    return Storage.at(s3_server.create_bucket("admission") + "/root")


def confined(root: Storage, working_dir: str, owned=("mine",)) -> str:
    spec = JobSpec.model_validate({**PROGRAM, "program": {**PROGRAM["program"], "working_dir": working_dir}})
    out = confine_paths(spec, root, lambda job_id: job_id in owned)
    assert out.program is not None and out.program.working_dir is not None
    return out.program.working_dir


def test_paths_relative_to_the_root_or_uris_under_it_are_stored_as_full_uris(root):
    assert confined(root, "team/code") == "s3://admission/root/team/code"
    assert confined(root, "s3://admission/root/team/code/") == "s3://admission/root/team/code"
    assert confined(root, "jobs/mine/checkpoints") == "s3://admission/root/jobs/mine/checkpoints"


@pytest.mark.parametrize("value, rule", [
    ("s3://other-bucket/root/x", "under the storage root s3://admission/root"),
    ("s3://admission/root-sibling/x", "under the storage root"),  # a prefix of the name is not the root
    ("s3://admission", "under the storage root"),
    ("gs://admission/root/x", "under the storage root"),
    ("/etc", "under the storage root"),  # a local path: no node has it
    ("file:///etc", "under the storage root"),
    ("team/../../x", "may not contain '..'"),
    ("ftp://admission/root/x", "ftp:// is not a supported storage scheme"),
    ("jobs/theirs/checkpoints", "jobs/theirs is not one of this tenant's jobs"),
    ("s3://admission/root/jobs/theirs", "jobs/theirs is not one of this tenant's jobs"),
])
def test_anything_else_is_refused_naming_the_field(root, value, rule):
    with pytest.raises(InvalidRequest, match=rule) as refused:
        confined(root, value)
    assert refused.value.field == "program.working_dir" and "program.working_dir: " in refused.value.message


def test_a_code_reference_must_be_in_the_store(root):
    sha = "d" * 64
    with pytest.raises(InvalidRequest, match="is not uploaded code"):
        confined(root, f"code:{sha}")
    root.write_bytes(f"code/{sha}.zip", b"")
    assert confined(root, f"code:{sha}") == f"code:{sha}"
