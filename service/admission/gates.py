"""What a tenant's job spec may ask for, checked at submit before anything is written.

- user code (`model.entrypoint`, `data.entrypoint`, `program`, and uploading a program's code with
  POST /v1/code) runs arbitrary Python in the workers: only for tenants with allow_user_code (NotAllowed: 403);
- fault injection needs the server setting (the spec's own rule, 422) and an admin-scoped
  token (NotAllowed: 403), so a tenant cannot crash its own workers on a shared cluster at will;
- storage paths (`train.init_from`, `model.hf.pretrained`, `program.working_dir`) stay under the storage root,
  a local directory or an object store alike: no `..`, no absolute path or URI outside it, and a path into
  `jobs/<id>/` must name one of the caller's own jobs (InvalidRequest: 422). A relative path is taken from
  the storage root and stored absolute (a path, or the full URI on an object store), as the workers read it.
  A `program.working_dir` may instead be `code:<sha256>`, uploaded code that must be in the store
  (service/code_store.py; else 422); it is stored as it is.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from service import code_store
from service.db.models import Tenant
from service.records import TenantRecord
from service.refusals import InvalidRequest, NotAllowed
from workers.spec import CODE_REF_PREFIX, EntrypointSpec, JobSpec
from workers.storage import Storage

PATH_FIELDS = (("train", "init_from"), ("model", "hf", "pretrained"), ("program", "working_dir"))
CODE_REF_FIELDS = (("program", "working_dir"),)  # may name uploaded code instead of a path
_USER_CODE = "(allow_user_code is false; an admin can allow it with PATCH /v1/tenants/{id})"


def check_fault_injection_scope(data: dict, scopes: frozenset[str]) -> None:
    if data.get("fault_injection") and "admin" not in scopes:
        raise NotAllowed("fault_injection: needs a token with the admin scope "
                         f"(this token has {sorted(scopes)})", "fault_injection")


def check_user_code(spec: JobSpec, tenant: Tenant) -> None:
    if tenant.allow_user_code:
        return
    for field in ("model", "data"):
        if isinstance(getattr(spec, field), EntrypointSpec):
            raise NotAllowed(f"{field}.entrypoint: tenant {tenant.name!r} may not run user code {_USER_CODE}",
                             f"{field}.entrypoint")
    if spec.program is not None:
        raise NotAllowed(f"program: tenant {tenant.name!r} may not run user code {_USER_CODE}", "program")


def check_code_upload(tenant: Tenant | TenantRecord) -> None:
    if not tenant.allow_user_code:
        raise NotAllowed(f"body: tenant {tenant.name!r} may not upload user code {_USER_CODE}", "body")


def confine_paths(spec: JobSpec, root: Storage, owns_job: Callable[[str], bool]) -> JobSpec:
    """The spec with every storage path made absolute under `root`; InvalidRequest for one outside it,
    or for a code reference that names no stored code."""
    for path_of_field in PATH_FIELDS:
        value = _get(spec, path_of_field)
        if not isinstance(value, str):
            continue
        name = ".".join(path_of_field)
        if path_of_field in CODE_REF_FIELDS and value.startswith(CODE_REF_PREFIX):
            _check_code_ref(value, root, name)
            continue
        if ".." in PurePosixPath(value).parts:
            raise InvalidRequest(f"{name}: may not contain '..' (paths stay under the storage root)", name)
        absolute, parts = _local_under(root, value, name) if root.is_local else _uri_under(root, value, name)
        if len(parts) >= 2 and parts[0] == "jobs" and not owns_job(parts[1]):
            raise InvalidRequest(f"{name}: jobs/{parts[1]} is not one of this tenant's jobs", name)
        spec = _replaced(spec, path_of_field, absolute)
    return spec


def _outside(name: str, root: Storage) -> InvalidRequest:
    return InvalidRequest(f"{name}: must be a path under the storage root {root.uri} "
                          "(relative to it, or absolute inside it)", name)


def _local_under(root: Storage, value: str, name: str) -> tuple[str, tuple[str, ...]]:
    """The absolute path and its parts under a local root (symlinks followed: no way out through one)."""
    if "://" in value:
        if not value.startswith("file://"):
            raise _outside(name, root)
        value = value.removeprefix("file://")
    base = Path(os.path.realpath(root.local_path))
    path = Path(os.path.realpath(base / value))  # an absolute value replaces base
    if not path.is_relative_to(base):
        raise _outside(name, root)
    return str(path), path.relative_to(base).parts


def _uri_under(root: Storage, value: str, name: str) -> tuple[str, tuple[str, ...]]:
    """The full URI and its parts under an object-store root (a store has no symlinks to follow)."""
    if "://" in value:
        try:
            uri = Storage.at(value).uri
        except ValueError as exc:
            raise InvalidRequest(f"{name}: {exc}", name) from None
    elif value.startswith("/"):  # a local path: no node has it
        raise _outside(name, root)
    else:
        uri = root.url(value)
    if uri != root.uri and not uri.startswith(root.uri + "/"):
        raise _outside(name, root)
    rel = uri[len(root.uri):].strip("/")
    return uri, tuple(p for p in rel.split("/") if p and p != ".")


def _check_code_ref(ref: str, root: Storage, name: str) -> None:
    try:
        stored = code_store.is_stored(root, ref)
    except ValueError as exc:  # not 'code:' and 64 hex digits; the message names the field
        raise InvalidRequest(str(exc), name) from None
    if not stored:
        raise InvalidRequest(f"{name}: {ref} is not uploaded code (POST /v1/code answers the reference "
                             "to use; upload the directory first)", name)


def _get(obj, path: tuple[str, ...]):
    for part in path:
        obj = getattr(obj, part, None)
    return obj


def _replaced(obj, path: tuple[str, ...], value):
    """A copy of the frozen spec with the field at `path` set to `value`."""
    head, *rest = path
    child = value if not rest else _replaced(getattr(obj, head), tuple(rest), value)
    return obj.model_copy(update={head: child})
