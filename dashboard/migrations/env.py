"""Alembic environment: runs on the connection the service hands over, or on the URL from
``TURNOUT_DATABASE_URL`` (through the service settings) for the alembic command line."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from turnout.dashboard.store.models import Base

target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = context.config.get_main_option("sqlalchemy.url")
    if not url:
        from turnout.dashboard.settings import get_settings

        url = get_settings().database_url
    engine = create_engine(url)
    with engine.begin() as conn:
        _run(conn)
    engine.dispose()


run_online()
