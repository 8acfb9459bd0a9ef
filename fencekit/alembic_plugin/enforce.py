"""``op.enforce_fence`` and ``op.rollout_fence``: switch a protected table between rollout mode
(``on_missing = allow``) and enforcing (``reject``) in one migration step.

``enforce_fence`` reads the table's registered spec and the rollout report when it runs
(:mod:`fencekit.catalog.rollout`, the same check as ``fencekit enforce``) and refuses, unless
``force=True``, while a writer without a token was seen inside ``window``; then it re-protects
the table with ``on_missing = reject`` (a policy: changed in place, every fence kept). Its
reverse, ``rollout_fence``, puts the table back in rollout mode. Both need a database: offline
(``alembic upgrade --sql``) there is no report to consult; write ``op.alter_fence`` with both
specs instead.

Importing :mod:`fencekit.alembic_plugin` registers them.
"""

from __future__ import annotations

from typing import Any

from alembic.operations import MigrateOperation, Operations

from fencekit import sqlgen
from fencekit.alembic_plugin.ops import run_sql
from fencekit.catalog.rollout import (
    DBAPIConnection,
    enforce_check,
    parse_duration,
    registered_spec,
)
from fencekit.catalog.session import pinned_path
from fencekit.errors import CatalogError
from fencekit.spec import DEFAULT_SCHEMA, FenceSpec, TableName

__all__ = ["EnforceFenceOp"]


@Operations.register_operation("enforce_fence")
class EnforceFenceOp(MigrateOperation):
    """Switch ``schema.table_name`` to ``on_missing = reject`` (``enforce=True``) or back to
    ``allow`` (``enforce=False``, the reverse)."""

    def __init__(
        self,
        table_name: str,
        *,
        schema: str | None = None,
        window: str = "7d",
        force: bool = False,
        enforce: bool = True,
    ) -> None:
        parse_duration(window)  # a bad window fails when the migration loads
        self.table = TableName(schema or DEFAULT_SCHEMA, table_name)
        self.window = window
        self.force = force
        self.enforce = enforce

    @classmethod
    def enforce_fence(
        cls,
        operations: Operations,
        table_name: str,
        *,
        schema: str | None = None,
        window: str = "7d",
        force: bool = False,
    ) -> None:
        """Refuse, unless ``force``, while `fencekit rollout` shows a writer without a token
        inside ``window`` (90s, 30min, 12h, 7d, 2w); else switch the table to reject."""
        operations.invoke(cls(table_name, schema=schema, window=window, force=force))

    @classmethod
    def rollout_fence(
        cls, operations: Operations, table_name: str, *, schema: str | None = None
    ) -> None:
        """Put the table back in rollout mode (``on_missing = allow``)."""
        operations.invoke(cls(table_name, schema=schema, enforce=False))

    def reverse(self) -> EnforceFenceOp:
        return EnforceFenceOp(
            self.table.name,
            schema=self.table.schema,
            window=self.window,
            force=self.force,
            enforce=not self.enforce,
        )

    def to_diff_tuple(self) -> tuple[Any, ...]:
        kind = "enforce_fence" if self.enforce else "rollout_fence"
        return (kind, self.table.schema, self.table.name)


Operations.register_operation("rollout_fence", "rollout_fence")(EnforceFenceOp)


def _rollout_spec(conn: Any, table: TableName) -> FenceSpec:
    d = registered_spec(conn, table).as_dict()
    d["on_missing"] = "allow"
    return FenceSpec.from_dict(d)


@Operations.implementation_for(EnforceFenceOp)
def _enforce(operations: Operations, operation: EnforceFenceOp) -> None:
    if operations.get_context().as_sql:
        raise CatalogError(
            "enforce_fence reads the table's spec and who still writes it without a token, "
            "which needs a database: run this migration online, or write op.alter_fence with "
            "both specs for an offline script"
        )
    conn: Any = DBAPIConnection(operations.get_bind().connection)
    # The migration's own connection, under the migrating role's search_path until pinned
    with pinned_path(conn):
        if operation.enforce:
            spec = enforce_check(
                conn, operation.table, parse_duration(operation.window), force=operation.force
            )
            title = f"enforce {operation.table.sql}"
        else:
            spec = _rollout_spec(conn, operation.table)
            title = f"rollout mode for {operation.table.sql}"
    run_sql(operations, sqlgen.protect_statements(spec), title)
