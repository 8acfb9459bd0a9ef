"""Autogenerate: compare the fences declared in the metadata with the database's registry.

Runs after alembic's own table comparison (last priority), so that it can

- append ``create_fence`` after the ``create_table`` / ``add_column`` it depends on, and
  ``alter_fence`` for a changed declaration (policies in place; another scope, key, resource
  or fence column with the fences carried) or for objects an older template made,
- put ``drop_fence`` first, before a ``drop_table`` of the same table,
- put ``install_fencekit`` / ``upgrade_fencekit`` before everything,
- remove any operation alembic proposed against objects fencekit owns (the fence column of a
  protected table, ``fencekit_*`` indexes, the ``fencekit`` schema's tables): the filters in
  :mod:`fencekit.alembic_plugin.filters` skip them earlier, this also covers an env.py without
  them and fence columns with custom names.

Each fence operation is made with its SQL frozen (see :mod:`fencekit.alembic_plugin.ops`). The
downgrade is alembic's reversal of that list, so it drops fences before tables and installs the
core last.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from alembic.operations import ops as alembic_ops

from fencekit import sqlgen
from fencekit.alembic_plugin.filters import CORE_SCHEMA
from fencekit.alembic_plugin.ops import (
    AlterFenceOp,
    FenceOp,
    InstallCoreOp,
    RenameFenceOp,
    UpgradeCoreOp,
)
from fencekit.alembic_plugin.registry import Installed, pinned_connection, read_installed
from fencekit.declare import INFO_KEY, declared_fences
from fencekit.ident import object_tag
from fencekit.spec import FenceSpec, Scope, TableName

if TYPE_CHECKING:
    from alembic.autogenerate.api import AutogenContext
    from alembic.operations.ops import MigrateOperation, UpgradeOps
    from sqlalchemy.engine import Connection

__all__ = ["compare_fences"]

OWNED_PREFIX = "fencekit"
"""Every per-table object the generator creates is named with this prefix."""


def compare_fences(
    autogen_context: AutogenContext, upgrade_ops: UpgradeOps, schemas: set[str | None]
) -> None:
    """The ``schema``-level comparator: alembic calls it once with the schemas it compares."""
    connection = autogen_context.connection
    assert connection is not None, "autogenerate always has a connection"
    default_schema = connection.dialect.default_schema_name or "public"

    def real(schema: str | None) -> str:
        return default_schema if schema is None else schema

    compared = {real(s) for s in schemas}
    declared: dict[tuple[str, str], FenceSpec] = {}
    # Tables of the metadata that autogenerate looks at (filters applied): their fences are ours.
    known: set[tuple[str, str]] = set()
    for table in autogen_context.sorted_tables:
        where = (real(table.schema), table.name)
        if where[0] in compared and autogen_context.run_object_filters(
            table, table.name, "table", False, None
        ):
            known.add(where)
    metadata = autogen_context.metadata
    for table, spec in declared_fences(metadata) if metadata is not None else ():
        if table.schema is None:  # declared without a schema: it lives in the default one
            spec = spec.with_changes(table=TableName(default_schema, table.name))
        if (spec.table.schema, spec.table.name) in known:
            declared[(spec.table.schema, spec.table.name)] = spec
    # Tables alembic is dropping in this migration: their fences go first.
    dropped = {
        (real(op.schema), op.table_name)
        for op in upgrade_ops.ops
        if isinstance(op, alembic_ops.DropTableOp)
    }

    with pinned_connection(connection):
        installed = read_installed(connection)
    existing = {
        where: fence
        for where, fence in installed.fences.items()
        if where[0] in compared
        and autogen_context.run_name_filters(
            where[1], "table", {"schema_name": None if where[0] == default_schema else where[0]}
        )
    }

    _prune_owned(upgrade_ops, installed, real)
    _strip_declarations(upgrade_ops)

    first: list[MigrateOperation] = []
    last: list[MigrateOperation] = []
    with pinned_connection(connection):
        renamed = _renamed(connection, existing, set(declared) - set(existing))
    for where, spec in sorted(declared.items()):
        if where in renamed:
            # The table was renamed (op.rename_table): move its fence rather than protect it
            # a second time under the new name, then change the fence if the declaration did.
            old = existing.pop(renamed[where])[0]
            rename = RenameFenceOp.generate(old, spec.table)
            last.append(rename)
            if rename.renamed != spec:
                last.append(FenceOp.generate(rename.renamed, spec))
            continue
        if where not in existing:
            last.append(FenceOp.generate(None, spec))
            continue
        old, old_template = existing[where]
        if old != spec:
            # Its protect half renders the current template, so objects of an older one go too.
            last.append(FenceOp.generate(old, spec))
        elif old_template < sqlgen.TEMPLATE_VERSION:
            # Objects of an older template (fencekit was upgraded): re-protect them, so the
            # upgrade of fencekit arrives as a migration that a reviewer sees and runs. A newer
            # template than ours (an older fencekit autogenerating) is left alone.
            last.append(AlterFenceOp.refresh(spec, old_template))
    for where, (old, _) in sorted(existing.items()):
        # A protected table outside the metadata (filtered out, or protected by a DBA with the
        # CLI) keeps its fence unless alembic drops the table itself.
        if where not in declared and (where in known or where in dropped):
            first.append(FenceOp.generate(old, None))

    if declared:
        if installed.core_version is None:
            first.insert(0, InstallCoreOp(sqlgen.CORE_VERSION))
        elif installed.core_version < sqlgen.CORE_VERSION:
            first.insert(0, UpgradeCoreOp(installed.core_version, sqlgen.CORE_VERSION))

    upgrade_ops.ops[:0] = first
    upgrade_ops.ops.extend(last)


def _renamed(
    connection: Connection,
    existing: dict[tuple[str, str], tuple[FenceSpec, int]],
    wanted: set[tuple[str, str]],
) -> dict[tuple[str, str], tuple[str, str]]:
    """Declared-but-unprotected tables that are a protected table renamed: the registry's table
    no longer exists and its TRUNCATE trigger (named after the registry's tag) is on the
    declared table. Maps the new name to the old one."""
    out: dict[tuple[str, str], tuple[str, str]] = {}
    if not wanted:
        return out
    for (schema, name), _ in existing.items():
        row = connection.exec_driver_sql(
            "SELECT n.nspname, c.relname FROM pg_catalog.pg_trigger g "
            "JOIN pg_catalog.pg_class c ON c.oid = g.tgrelid "
            "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
            "WHERE g.tgname = %(trigger)s AND NOT c.relispartition "
            "AND pg_catalog.to_regclass(%(old)s) IS NULL LIMIT 1",
            {
                "trigger": f"fencekit_{object_tag(schema, name)}_trunc",
                "old": TableName(schema, name).sql,
            },
        ).first()
        if row is not None and (row[0], row[1]) in wanted:
            out[(row[0], row[1])] = (schema, name)
    return out


def _strip_declarations(upgrade_ops: UpgradeOps) -> None:
    """The declaration is rendered as the fence operation, not as ``create_table(info=...)``."""
    for op in upgrade_ops.ops:
        if isinstance(op, alembic_ops.CreateTableOp) and op.info:
            op.info.pop(INFO_KEY, None)


def _prune_owned(
    upgrade_ops: UpgradeOps, installed: Installed, real: Callable[[str | None], str]
) -> None:
    """Drop alembic's proposals against the fence column and fencekit-named indexes."""
    fence_columns = {
        (schema, name, spec.column)
        for (schema, name), (spec, _) in installed.fences.items()
        if spec.scope is Scope.ROW
    }

    def owned(op: MigrateOperation, schema: str, table: str) -> bool:
        if isinstance(op, alembic_ops.DropColumnOp):
            return (schema, table, op.column_name) in fence_columns
        if isinstance(op, alembic_ops.DropIndexOp):
            return str(op.index_name or "").startswith(OWNED_PREFIX)
        return False

    kept: list[MigrateOperation] = []
    for op in upgrade_ops.ops:
        schema = getattr(op, "schema", None)
        if isinstance(op, alembic_ops.DropTableOp) and schema == CORE_SCHEMA:
            continue  # fencekit's own tables, when env.py has no include_name filter
        if isinstance(op, alembic_ops.ModifyTableOps):
            if schema == CORE_SCHEMA:
                continue
            schema, table = real(op.schema), op.table_name
            op.ops = [sub for sub in op.ops if not owned(sub, schema, table)]
            if not op.ops:
                continue
        kept.append(op)
    upgrade_ops.ops[:] = kept
