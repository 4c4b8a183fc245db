"""Where a job's files live: a local directory or an object store, behind one small interface."""

from workers.storage.location import SCHEMES, Storage

__all__ = ["SCHEMES", "Storage"]
