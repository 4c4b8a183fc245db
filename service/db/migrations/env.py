"""Alembic environment: runs against the engine the service hands over in config.attributes."""

from alembic import context
from sqlalchemy import create_engine

from service.db.models import Base

config = context.config
engine = config.attributes.get("engine")
if engine is None:  # run by the alembic command line: the URL from its configuration
    url = config.get_main_option("sqlalchemy.url")
    assert url is not None, "alembic: set sqlalchemy.url, or hand over an engine in config.attributes"
    engine = create_engine(url)

with engine.begin() as connection:
    context.configure(connection=connection, target_metadata=Base.metadata,
                      render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()
