"""The store's client variables (AWS_*, GOOGLE_*) that travel with a job's storage URI.

Decision (docs/deploy.md, storage): the control plane forwards the variables it has to its
supervisors, and a supervisor to its ranks, as arguments of their start calls, so a store configured
once on the service works on every node. A node that has its own (a Kubernetes Secret in the pod's
environment) keeps them where the control plane has none to give. Also forwarded:
TRAINYARD_STORE_RETRY_S, how long a checkpoint save keeps retrying an unreachable store.
"""

from __future__ import annotations

import os

from workers.storage.location import CLIENT_ENV

RETRY_ENV = "TRAINYARD_STORE_RETRY_S"
FORWARDED = (*CLIENT_ENV, RETRY_ENV)


def client_env() -> dict[str, str]:
    """The forwarded variables this process has."""
    return {k: os.environ[k] for k in FORWARDED if k in os.environ}


def adopt_client_env(env: dict[str, str] | None) -> None:
    """Take on the variables a launcher forwarded (they name the store this job writes to)."""
    unknown = set(env or {}) - set(FORWARDED)
    if unknown:
        raise ValueError(f"storage client env: not a store variable: {sorted(unknown)}")
    os.environ.update(env or {})
