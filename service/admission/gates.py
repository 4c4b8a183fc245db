"""What a tenant's job spec may ask for, checked at submit before anything is written.

- user code (`model.entrypoint`, `data.entrypoint`) runs arbitrary Python in the workers:
  only for tenants with allow_user_code (NotAllowed: 403);
- fault injection needs the server setting (the spec's own rule, 422) and an admin-scoped
  token (NotAllowed: 403), so a tenant cannot crash its own workers on a shared cluster at will;
- storage paths (`train.init_from`, `model.hf.pretrained`) stay under the storage root: no `..`, no absolute path
  outside it, and a path into `jobs/<id>/` must name one of the caller's own jobs (InvalidRequest: 422). A
  relative path is taken from the storage root and stored absolute, as the workers read it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from service.db.models import Tenant
from service.refusals import InvalidRequest, NotAllowed
from workers.spec import EntrypointSpec, JobSpec

PATH_FIELDS = (("train", "init_from"), ("model", "hf", "pretrained"))


def check_fault_injection_scope(data: dict, scopes: frozenset[str]) -> None:
    if data.get("fault_injection") and "admin" not in scopes:
        raise NotAllowed("fault_injection: needs a token with the admin scope "
                         f"(this token has {sorted(scopes)})", "fault_injection")


def check_user_code(spec: JobSpec, tenant: Tenant) -> None:
    for field in ("model", "data"):
        if isinstance(getattr(spec, field), EntrypointSpec) and not tenant.allow_user_code:
            raise NotAllowed(f"{field}.entrypoint: tenant {tenant.name!r} may not run user code "
                             "(allow_user_code is false; an admin can allow it with PATCH /v1/tenants/{id})",
                             f"{field}.entrypoint")


def confine_paths(spec: JobSpec, root: Path, owns_job: Callable[[str], bool]) -> JobSpec:
    """The spec with every storage path made absolute under `root`; InvalidRequest for one outside it."""
    root = Path(os.path.realpath(root))
    for path_of_field in PATH_FIELDS:
        value = _get(spec, path_of_field)
        if not isinstance(value, str):
            continue
        name = ".".join(path_of_field)
        if ".." in PurePosixPath(value).parts:
            raise InvalidRequest(f"{name}: may not contain '..' (paths stay under the storage root)", name)
        path = Path(os.path.realpath(root / value))  # an absolute value replaces root; symlinks are followed
        if not path.is_relative_to(root):
            raise InvalidRequest(f"{name}: must be a path under the storage root {root} "
                                 "(relative to it, or absolute inside it)", name)
        parts = path.relative_to(root).parts
        if len(parts) >= 2 and parts[0] == "jobs" and not owns_job(parts[1]):
            raise InvalidRequest(f"{name}: jobs/{parts[1]} is not one of this tenant's jobs", name)
        spec = _replaced(spec, path_of_field, str(path))
    return spec


def _get(obj, path: tuple[str, ...]):
    for part in path:
        obj = getattr(obj, part, None)
    return obj


def _replaced(obj, path: tuple[str, ...], value):
    """A copy of the frozen spec with the field at `path` set to `value`."""
    head, *rest = path
    child = value if not rest else _replaced(getattr(obj, head), tuple(rest), value)
    return obj.model_copy(update={head: child})
