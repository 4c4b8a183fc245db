from tests.db_fixtures import ray_address  # noqa: F401  (the session's local Ray for live servers)
