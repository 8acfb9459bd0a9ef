"""``EnforceFence``: switch a model's table from rollout mode (``on_missing = allow``) to
enforcing (``reject``) in one migration step, refused while writers without a token are seen.

When the migration runs, it reads the table's registered spec and the rollout report
(:mod:`fencekit.catalog.rollout`, the same check as ``fencekit enforce``); unless
``force=True`` it refuses while a writer without a token was seen inside ``window``. Then it
re-protects the table with ``on_missing = reject`` (a policy: changed in place, every fence
kept) and records that in the model's migration state (``Meta.fence``). Reversed, it puts the
table back in rollout mode.

    from fencekit.django.enforce import EnforceFence

    operations = [EnforceFence("Job", window="7d")]

Change the model's ``Meta.fence`` to ``on_missing="reject"`` in the same commit, so that
``makemigrations`` finds nothing left to do.
"""

from __future__ import annotations

from typing import Any

from django.db.migrations.operations.base import Operation, OperationCategory

from fencekit import sqlgen
from fencekit.catalog.rollout import (
    DBAPIConnection,
    enforce_check,
    parse_duration,
    registered_spec,
)
from fencekit.catalog.session import pinned_path
from fencekit.django.fences import META_OPTION, Fence
from fencekit.spec import FenceSpec, TableName
from fencekit.sqlgen.pin import pinned

__all__ = ["EnforceFence"]


def _with_on_missing(spec: FenceSpec, on_missing: str) -> FenceSpec:
    d = spec.as_dict()
    d["on_missing"] = on_missing
    return FenceSpec.from_dict(d)


class EnforceFence(Operation):
    """Switch model ``model_name``'s table to ``on_missing = reject`` if nobody wrote it
    without a token within ``window`` (90s, 30min, 12h, 7d, 2w), or ``force``."""

    reversible = True
    reduces_to_sql = False
    category = OperationCategory.ALTERATION

    def __init__(
        self, model_name: str, window: str = "7d", force: bool = False, enforce: bool = True
    ) -> None:
        parse_duration(window)  # a bad window fails when the migration loads
        self.model_name = model_name
        self.window = window
        self.force = force
        self.enforce = enforce

    @property
    def model_name_lower(self) -> str:
        return self.model_name.lower()

    def references_model(self, name: str, app_label: str) -> bool:
        return name.lower() == self.model_name_lower

    def state_forwards(self, app_label: str, state: Any) -> None:
        model_state = state.models[app_label, self.model_name_lower]
        fence = model_state.options.get(META_OPTION)
        if isinstance(fence, Fence):
            model_state.options[META_OPTION] = Fence(
                **{
                    **{name: getattr(fence, name) for name in fence.__dataclass_fields__},
                    "on_missing": "reject" if self.enforce else "allow",
                }
            )
            state.reload_model(app_label, self.model_name_lower, delay=True)

    def _switch(self, app_label: str, schema_editor: Any, state: Any, enforce: bool) -> None:
        connection = schema_editor.connection
        if connection.vendor != "postgresql":
            return
        model = state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(connection.alias, model):
            return
        fence = model._meta.original_attrs.get(META_OPTION) or getattr(
            model._meta, META_OPTION, None
        )
        schema = fence.schema if isinstance(fence, Fence) else "public"
        table = TableName(schema, model._meta.db_table)
        connection.ensure_connection()
        conn: Any = DBAPIConnection(connection.connection)
        # The migration's own connection, under the migrating role's search_path until pinned
        with pinned_path(conn):
            if enforce:
                spec = enforce_check(conn, table, parse_duration(self.window), force=self.force)
            else:
                spec = _with_on_missing(registered_spec(conn, table), "allow")
        for statement in pinned(sqlgen.protect_statements(spec)):
            schema_editor.execute(statement, params=None)

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        self._switch(app_label, schema_editor, to_state, self.enforce)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        self._switch(app_label, schema_editor, to_state, not self.enforce)

    def describe(self) -> str:
        if self.enforce:
            return f"Enforce the fence of model {self.model_name} (on_missing=reject)"
        return f"Put the fence of model {self.model_name} in rollout mode (on_missing=allow)"

    @property
    def migration_name_fragment(self) -> str:
        return f"enforce_{self.model_name_lower}"

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        kwargs: dict[str, Any] = {"model_name": self.model_name}
        if self.window != "7d":
            kwargs["window"] = self.window
        if self.force:
            kwargs["force"] = True
        if not self.enforce:
            kwargs["enforce"] = False
        return type(self).__name__, [], kwargs
