from tests.db_fixtures import db_url, ray_address, sessions  # noqa: F401
