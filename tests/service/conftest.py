from tests.db_fixtures import db_url, sessions  # noqa: F401
