"""Read fencekit's registry through the migration's own SQLAlchemy connection.

Autogenerate must read the database through the connection alembic gives it (any driver, inside
alembic's transaction), so this does not use psycopg-specific helpers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fencekit.spec import FenceSpec

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

__all__ = ["Installed", "read_installed"]


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
