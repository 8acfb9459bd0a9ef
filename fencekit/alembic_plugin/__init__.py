"""fencekit for alembic: fence operations, an autogenerate comparator and renderers.

Importing this module registers the operations (``op.create_fence``, ``op.alter_fence``,
``op.drop_fence``, ``op.install_fencekit``, ...) and their renderers. Migration files that use
them import it themselves. The comparator is wired by alembic version:

- alembic >= 1.18: alembic loads fencekit through its ``alembic.plugins`` entry point
  (:mod:`fencekit._alembic_entry`); the comparator runs when ``env.py`` passes
  ``autogenerate_plugins=AUTOGENERATE_PLUGINS`` (alembic's own comparators plus ``fencekit``:
  listing any plugin replaces alembic's default list).
- alembic 1.13 to 1.17: ``import fencekit.alembic_plugin`` in ``env.py`` registers the
  comparator with alembic's global comparators (``autogenerate_plugins`` is ignored there).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fencekit._alembic_entry import setup
from fencekit.alembic_plugin import enforce as enforce
from fencekit.alembic_plugin import grants as grants
from fencekit.alembic_plugin import ops as ops
from fencekit.alembic_plugin import render as render
from fencekit.alembic_plugin.filters import include_name, include_object
from fencekit.alembic_plugin.ops import (
    AlterFenceOp,
    CreateFenceOp,
    DropFenceOp,
    InstallCoreOp,
    UninstallCoreOp,
    UpgradeCoreOp,
)

__all__ = [
    "AUTOGENERATE_PLUGINS",
    "PLUGIN_NAME",
    "AlterFenceOp",
    "CreateFenceOp",
    "DropFenceOp",
    "InstallCoreOp",
    "UninstallCoreOp",
    "UpgradeCoreOp",
    "check_migration_path",
    "include_name",
    "include_object",
    "setup",
]

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

PLUGIN_NAME = "fencekit"
AUTOGENERATE_PLUGINS = ["alembic.autogenerate.*", PLUGIN_NAME]
"""What ``env.py`` passes as ``autogenerate_plugins``: alembic's own comparators and ours."""


def check_migration_path(
    connection: Connection,
    *,
    version_table: str = "alembic_version",
    version_table_schema: str | None = None,
) -> None:
    """Refuse (CatalogError) a migration connection whose search_path reaches a schema another
    role controls, or a version table another role owns or hung triggers on: alembic's own
    reflection and version writes would run that role's code as the migrating role. env.py
    calls it before ``context.configure``; see :mod:`fencekit.catalog.trusted_path`."""
    from fencekit.catalog.rollout import DBAPIConnection
    from fencekit.catalog.trusted_path import check_migration_path as check

    raw = connection.connection
    ours = not connection.in_transaction()  # else the caller's transaction: leave it be
    try:
        check(
            DBAPIConnection(raw),
            version_table=version_table,
            version_table_schema=version_table_schema,
        )
    finally:
        if ours:  # read only: leave no transaction open that SQLAlchemy does not know of
            raw.rollback()


def _register_comparator() -> None:
    """Older alembic, or fencekit run from a source tree without its entry point installed."""
    import fencekit._alembic_entry as entry

    try:
        from alembic.runtime import plugins
    except ImportError:  # alembic < 1.18: no plugin API, a global comparator list instead
        from alembic.autogenerate import comparators

        comparators.dispatch_for("schema")(entry._compare)
        return
    if PLUGIN_NAME not in plugins._all_plugins:  # loaded by the entry point otherwise
        plugins.Plugin.setup_plugin_from_module(entry, PLUGIN_NAME)


_register_comparator()
