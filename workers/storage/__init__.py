"""Where a job's files live: a local directory or an object store, behind one small interface."""

from workers.storage.client_env import adopt_client_env, client_env
from workers.storage.location import SCHEMES, Storage
from workers.storage.scratch import local_dir

__all__ = ["SCHEMES", "Storage", "adopt_client_env", "client_env", "local_dir"]
