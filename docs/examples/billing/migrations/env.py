"""alembic environment of the billing example, wired for fencekit (see docs/alembic.md)."""

import os

from alembic import context
from billing.models import metadata
from sqlalchemy import engine_from_config, pool

import fencekit.alembic_plugin as fencekit_alembic

config = context.config
url = os.environ.get("DATABASE_URL") or config.get_main_option("sqlalchemy.url")


def run_migrations_online() -> None:
    engine = engine_from_config(
        {"sqlalchemy.url": url}, prefix="sqlalchemy.", poolclass=pool.NullPool
    )
    with engine.connect() as connection:
        fencekit_alembic.check_migration_path(connection)  # docs/alembic.md
        context.configure(
            connection=connection,
            target_metadata=metadata,
            include_name=fencekit_alembic.include_name,
            include_object=fencekit_alembic.include_object,
            autogenerate_plugins=fencekit_alembic.AUTOGENERATE_PLUGINS,
        )
        with context.begin_transaction():
            # A fence's DDL waits at most this long for its lock (docs/alembic.md).
            context.execute(f"SET lock_timeout = '{config.get_main_option('lock_timeout')}'")
            context.run_migrations()


run_migrations_online()
