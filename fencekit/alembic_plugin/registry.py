"""Read fencekit's registry through the migration's own SQLAlchemy connection.

Autogenerate must read the database through the connection alembic gives it (any driver, inside
alembic's transaction), so this does not use psycopg-specific helpers. Every read runs with that
connection's search_path pinned (:func:`pinned_connection`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fencekit.catalog.rollout import DBAPIConnection
from fencekit.catalog.session import pinned_path
from fencekit.spec import FenceSpec

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

__all__ = ["Installed", "pinned_connection", "read_installed"]


@contextlib.contextmanager
def pinned_connection(connection: Connection) -> Iterator[None]:
    """The migration's connection with ``search_path = pg_catalog, pg_temp`` while the block
    runs (transaction-local), its own path restored after: an operator planted in a schema on
    the migrating role's path never runs in fencekit's reads."""
    with pinned_path(DBAPIConnection(connection.connection)):
        yield


@dataclass(frozen=True)
class Installed:
    """What the database has: the core's version (None: not installed) and protected tables,
    each with its spec and the template that generated its objects (autogenerate re-protects
    tables whose objects an older template made)."""

    core_version: int | None
    fences: dict[tuple[str, str], tuple[FenceSpec, int]]


def read_installed(connection: Connection) -> Installed:
    """The installed core version and every protected table with its spec and template."""
    present = connection.exec_driver_sql(
        "SELECT pg_catalog.to_regclass('fencekit.protected') IS NOT NULL"
    ).scalar()
    if not present:
        return Installed(None, {})
    version = connection.exec_driver_sql(
        "SELECT value FROM fencekit.meta WHERE key = 'core_version'"
    ).scalar()
    rows = connection.exec_driver_sql(
        "SELECT schema_name, table_name, spec, template_version FROM fencekit.protected"
    ).all()
    fences: dict[tuple[str, str], tuple[FenceSpec, int]] = {}
    for schema, name, spec, template_version in rows:
        data: dict[str, Any] = json.loads(spec) if isinstance(spec, str) else spec
        fences[(schema, name)] = (FenceSpec.from_dict(data), int(template_version))
    return Installed(int(version) if version is not None else 0, fences)
