"""alembic environment wired for fencekit.

What fencekit adds to alembic's generic env.py:

- ``import fencekit.alembic_plugin``: registers ``op.create_fence`` and friends, and on alembic
  older than 1.18 the fence comparator (newer alembic loads it through its plugin entry point);
- ``autogenerate_plugins``: alembic's own comparators plus fencekit's (alembic >= 1.18);
- ``include_name`` / ``include_object``: autogenerate never proposes dropping the ``fencekit``
  schema, the fence columns, or fencekit's indexes;
- ``check_migration_path``: refuses to migrate when the connection's search_path reaches a
  schema another role can create objects in (``"$user"``, ``public``), or alembic_version is
  another role's: alembic's own catalog queries would run that role's code as you;
- ``lock_timeout`` (alembic.ini): a migration waits at most that long for each lock;
- ``fencekit_writer_roles`` (alembic.ini): the roles autogenerate grants ``fencekit_writer``
  (they take leases from fencekit's issuer).
"""

import importlib
import os
from logging.config import fileConfig
from typing import Any

from alembic import context
from sqlalchemy import engine_from_config, pool

import fencekit.alembic_plugin as fencekit_alembic
from fencekit.ident import quote_literal

config = context.config

if config.config_file_name is not None:
    fileConfig(config.config_file_name)


def _load_metadata(target: str | None) -> Any:
    """``package.module:attribute.path`` -> the object (a MetaData, or a list of them)."""
    if not target:
        return None
    module_name, _, path = target.partition(":")
    obj: Any = importlib.import_module(module_name.strip())
    for part in path.strip().split(".") if path.strip() else ():
        obj = getattr(obj, part)
    return obj


# Your models' MetaData: set target_metadata in alembic.ini, or replace this line, e.g.
#   from myapp.models import Base; target_metadata = Base.metadata
target_metadata = _load_metadata(config.get_main_option("target_metadata"))

url = os.environ.get("DATABASE_URL") or config.get_main_option("sqlalchemy.url")
include_schemas = (config.get_main_option("include_schemas") or "false").lower() == "true"
lock_timeout = config.get_main_option("lock_timeout")

common: dict[str, Any] = {
    "target_metadata": target_metadata,
    "include_schemas": include_schemas,
    "include_name": fencekit_alembic.include_name,
    "include_object": fencekit_alembic.include_object,
    "autogenerate_plugins": fencekit_alembic.AUTOGENERATE_PLUGINS,
    "fencekit_writer_roles": (config.get_main_option("fencekit_writer_roles") or "").split(),
}


def _lock_timeout_sql() -> str | None:
    """Fail fast instead of queueing behind long transactions (and blocking the traffic queued
    behind us) when a fence's ALTER TABLE / CREATE TRIGGER waits for its lock; retry later.
    Session-wide, not SET LOCAL: the session is the migration's own, and the setting must hold
    with transaction_per_migration=True as well."""
    return f"SET lock_timeout = {quote_literal(lock_timeout)}" if lock_timeout else None


def run_migrations_offline() -> None:
    """``alembic upgrade --sql``: print the SQL (fence DDL included) for review and psql."""
    context.configure(url=url, literal_binds=True, dialect_opts={"paramstyle": "named"}, **common)
    with context.begin_transaction():
        if set_lock_timeout := _lock_timeout_sql():
            context.execute(set_lock_timeout)
        context.run_migrations()


def run_migrations_online() -> None:
    connectable = engine_from_config(
        {"sqlalchemy.url": url}, prefix="sqlalchemy.", poolclass=pool.NullPool
    )
    with connectable.connect() as connection:
        fencekit_alembic.check_migration_path(connection)
        if set_lock_timeout := _lock_timeout_sql():
            connection.exec_driver_sql(set_lock_timeout)
            connection.commit()
        context.configure(connection=connection, **common)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
