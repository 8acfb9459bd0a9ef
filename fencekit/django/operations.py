"""Django migration operations: ``InstallFencekit``, ``ProtectTable``, ``MoveFence`` and
``UnprotectTable``.

Each fence operation carries its spec (a :meth:`FenceSpec.as_dict` dict) and the SQL it runs,
frozen into the migration file by ``makemigrations``: the statements ``fencekit.sqlgen``
produced then, and the ones its reverse runs. An old migration does what it did when it was
written, whatever fencekit's templates have become since. An operation written by hand without
``sql=`` renders the current template when it runs (as the alembic operations do:
:mod:`fencekit.alembic_plugin.ops`). ``sqlmigrate`` prints the statements.

Frozen statements are written one source line per SQL line (:class:`Statements`), so the diff
of a migration is reviewable SQL rather than one escaped string.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.db.migrations.operations.base import Operation, OperationCategory
from django.db.migrations.serializer import BaseSerializer
from django.db.migrations.writer import MigrationWriter

from fencekit import sqlgen
from fencekit.django.fences import META_OPTION, Fence
from fencekit.errors import SpecError
from fencekit.spec import FenceSpec
from fencekit.sqlgen.pin import pinned

__all__ = [
    "InstallFencekit",
    "MoveFence",
    "ProtectTable",
    "Statements",
    "UnprotectTable",
    "change_statements",
]


class Statements:
    """Frozen SQL statements as the migration writer renders them (see the module docstring).

    Only the writer sees this type: the file it writes holds a plain tuple of strings.
    """

    def __init__(self, statements: Iterable[str]) -> None:
        self.statements = tuple(statements)


class _StatementsSerializer(BaseSerializer):
    value: Statements

    def serialize(self) -> tuple[str, set[str]]:
        out = ["("]
        for statement in self.value.statements:
            lines = statement.splitlines(keepends=True) or [""]
            if len(lines) == 1:
                out.append(f"    {lines[0]!r},")
                continue
            out.append("    (")
            out += [f"        {line!r}" for line in lines]
            out.append("    ),")
        out.append(")")
        return "\n".join(out), set()


MigrationWriter.register_serializer(Statements, _StatementsSerializer)


def _frozen(sql: Iterable[str] | None, argument: str) -> tuple[str, ...] | None:
    if sql is None:
        return None
    if isinstance(sql, (str, bytes)):
        raise TypeError(
            f"{argument}= takes a sequence of SQL statements (a tuple of strings), not one "
            "string: fencekit runs each statement as written and never splits a script"
        )
    statements = tuple(sql.statements if isinstance(sql, Statements) else sql)
    for statement in statements:
        if not isinstance(statement, str):
            raise TypeError(f"{argument}= holds {statement!r}, not an SQL statement string")
    return statements


def _or(frozen: tuple[str, ...] | None, current: list[str]) -> Iterable[str]:
    """The frozen statements when the migration has them (even none), else the current ones."""
    return frozen if frozen is not None else current


def _spec(value: FenceSpec | Mapping[str, Any]) -> FenceSpec:
    return value if isinstance(value, FenceSpec) else FenceSpec.from_dict(dict(value))


def change_statements(old: FenceSpec, new: FenceSpec) -> list[str]:
    """The current template's SQL from fence ``old`` to fence ``new`` on the same table: a
    move when the structure changes (scope, key, resource, column; fences carried), else
    protect again (new policies, same objects, fences kept)."""
    if sqlgen.is_move(old, new):
        return sqlgen.move_statements(old, new)
    return sqlgen.protect_statements(new)


def _lock_timeout() -> str:
    return f"SET LOCAL lock_timeout = {quote_literal(sqlgen.DEFAULT_LOCK_TIMEOUT)}"


def quote_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


class _FencekitOperation(Operation):
    reversible = True
    reduces_to_sql = True

    def _run(self, schema_editor: Any, statements: Iterable[str]) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return
        # No DDL here waits long for its lock (a protect must not queue every writer behind
        # it); the migration's later operations get the server's default back.
        schema_editor.execute(_lock_timeout(), params=None)
        # Parsed under search_path = pg_catalog, pg_temp, the migration's own restored after:
        # no operator planted in public is bound (fencekit.sqlgen.pin).
        for statement in pinned(statements):
            schema_editor.execute(statement, params=None)
        schema_editor.execute("SET LOCAL lock_timeout TO DEFAULT", params=None)


class InstallFencekit(_FencekitOperation):
    """Install fencekit's core schema, or upgrade it in place from ``upgrade_from``.

    The ``fencekit`` app's own migrations hold these, one per core version: add
    ``fencekit.django`` to ``INSTALLED_APPS`` and ``migrate`` installs (or upgrades) the core
    before any ``ProtectTable``. The core install is idempotent and only ever adds, so it
    installs the newest core whatever ``core_version`` says. Reversed, the first install
    removes the core (every fence must be gone); an upgrade undoes nothing (an older fencekit
    runs on a newer core).
    """

    category = OperationCategory.SQL

    def __init__(self, core_version: int, upgrade_from: int | None = None) -> None:
        self.core_version = core_version
        self.upgrade_from = upgrade_from

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if self.core_version > sqlgen.CORE_VERSION:
            raise ValueError(
                f"this migration needs fencekit core version {self.core_version}, but this "
                f"fencekit installs version {sqlgen.CORE_VERSION}: upgrade fencekit to run it"
            )
        self._run(schema_editor, sqlgen.install_statements())

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if self.upgrade_from is None:
            self._run(schema_editor, sqlgen.uninstall_statements())

    def describe(self) -> str:
        if self.upgrade_from is not None:
            return f"Upgrade fencekit's core schema from {self.upgrade_from} to {self.core_version}"
        return f"Install fencekit's core schema (version {self.core_version})"

    @property
    def migration_name_fragment(self) -> str:
        return f"core_{self.core_version}"

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        kwargs: dict[str, Any] = {"core_version": self.core_version}
        if self.upgrade_from is not None:
            kwargs["upgrade_from"] = self.upgrade_from
        return type(self).__name__, [], kwargs


class _TableOperation(_FencekitOperation):
    """A fence operation on one model's table."""

    model_name: str

    @property
    def model_name_lower(self) -> str:
        return self.model_name.lower()

    def references_model(self, name: str, app_label: str) -> bool:
        return name.lower() == self.model_name_lower

    def _set_state(self, app_label: str, state: Any, spec: FenceSpec | None) -> None:
        model_state = state.models[app_label, self.model_name_lower]
        if spec is None:
            model_state.options.pop(META_OPTION, None)
        else:
            model_state.options[META_OPTION] = Fence.from_spec(spec)
        state.reload_model(app_label, self.model_name_lower, delay=True)

    def _allowed(self, schema_editor: Any, to_state: Any, app_label: str) -> bool:
        model = to_state.apps.get_model(app_label, self.model_name)
        return bool(self.allow_migrate_model(schema_editor.connection.alias, model))


class ProtectTable(_TableOperation):
    """Protect a model's table with a fence: column (row fences), functions, triggers."""

    category = OperationCategory.ADDITION

    def __init__(
        self,
        model_name: str,
        spec: FenceSpec | Mapping[str, Any],
        sql: Iterable[str] | None = None,
        reverse_sql: Iterable[str] | None = None,
    ) -> None:
        self.model_name = model_name
        self.spec = _spec(spec)
        self.sql = _frozen(sql, "sql")
        self.reverse_sql = _frozen(reverse_sql, "reverse_sql")

    @classmethod
    def generate(cls, model_name: str, spec: FenceSpec) -> ProtectTable:
        """What makemigrations writes: protect and its undo, frozen now."""
        return cls(
            model_name, spec, sqlgen.protect_statements(spec), sqlgen.unprotect_statements(spec)
        )

    def state_forwards(self, app_label: str, state: Any) -> None:
        self._set_state(app_label, state, self.spec)

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if self._allowed(schema_editor, to_state, app_label):
            self._run(schema_editor, _or(self.sql, sqlgen.protect_statements(self.spec)))

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if self._allowed(schema_editor, from_state, app_label):
            self._run(schema_editor, _or(self.reverse_sql, sqlgen.unprotect_statements(self.spec)))

    def describe(self) -> str:
        return f"Protect {self.spec.table} with a {self.spec.scope} fence (model {self.model_name})"

    @property
    def migration_name_fragment(self) -> str:
        return f"protect_{self.model_name_lower}"

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        kwargs: dict[str, Any] = {"model_name": self.model_name, "spec": self.spec.as_dict()}
        if self.sql is not None:
            kwargs["sql"] = Statements(self.sql)
        if self.reverse_sql is not None:
            kwargs["reverse_sql"] = Statements(self.reverse_sql)
        return type(self).__name__, [], kwargs


class UnprotectTable(_TableOperation):
    """Remove a model's fence (triggers, functions, fence column, counters, registry row).

    The full spec makes it reversible; a row fence's fences are lost with its column.
    """

    category = OperationCategory.REMOVAL

    def __init__(
        self,
        model_name: str,
        spec: FenceSpec | Mapping[str, Any],
        sql: Iterable[str] | None = None,
        reverse_sql: Iterable[str] | None = None,
    ) -> None:
        self.model_name = model_name
        self.spec = _spec(spec)
        self.sql = _frozen(sql, "sql")
        self.reverse_sql = _frozen(reverse_sql, "reverse_sql")

    @classmethod
    def generate(cls, model_name: str, spec: FenceSpec) -> UnprotectTable:
        """What makemigrations writes: unprotect and its undo, frozen now."""
        return cls(
            model_name, spec, sqlgen.unprotect_statements(spec), sqlgen.protect_statements(spec)
        )

    def state_forwards(self, app_label: str, state: Any) -> None:
        self._set_state(app_label, state, None)

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if self._allowed(schema_editor, from_state, app_label):
            self._run(schema_editor, _or(self.sql, sqlgen.unprotect_statements(self.spec)))

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if self._allowed(schema_editor, to_state, app_label):
            self._run(schema_editor, _or(self.reverse_sql, sqlgen.protect_statements(self.spec)))

    def describe(self) -> str:
        return f"Unprotect {self.spec.table} (model {self.model_name})"

    @property
    def migration_name_fragment(self) -> str:
        return f"unprotect_{self.model_name_lower}"

    deconstruct = ProtectTable.deconstruct


class MoveFence(_TableOperation):
    """Change a model's fence from spec ``old`` to spec ``new``, fences carried over.

    Another scope, key, resource or fence column is a move in one transaction
    (:func:`fencekit.sqlgen.move_statements`: never unprotected in between); new policies
    only re-protect in place. ``old`` must be what the registry holds; the SQL refuses
    otherwise.
    """

    category = OperationCategory.ALTERATION

    def __init__(
        self,
        model_name: str,
        old: FenceSpec | Mapping[str, Any],
        new: FenceSpec | Mapping[str, Any],
        sql: Iterable[str] | None = None,
        reverse_sql: Iterable[str] | None = None,
    ) -> None:
        self.model_name = model_name
        self.old = _spec(old)
        self.new = _spec(new)
        if self.old.table != self.new.table:
            raise SpecError(
                f"MoveFence keeps the table ({self.old.table} -> {self.new.table}): move the "
                "fence of a renamed table with `fencekit rename` (see docs/django.md)"
            )
        self.sql = _frozen(sql, "sql")
        self.reverse_sql = _frozen(reverse_sql, "reverse_sql")

    @classmethod
    def generate(cls, model_name: str, old: FenceSpec, new: FenceSpec) -> MoveFence:
        """What makemigrations writes: the change and its way back, frozen now."""
        return cls(model_name, old, new, change_statements(old, new), change_statements(new, old))

    def state_forwards(self, app_label: str, state: Any) -> None:
        self._set_state(app_label, state, self.new)

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if self._allowed(schema_editor, to_state, app_label):
            self._run(schema_editor, _or(self.sql, change_statements(self.old, self.new)))

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if self._allowed(schema_editor, to_state, app_label):
            self._run(schema_editor, _or(self.reverse_sql, change_statements(self.new, self.old)))

    def describe(self) -> str:
        return (
            f"Move the fence of {self.new.table} ({self.old.scope} -> {self.new.scope} fence, "
            "fences carried)"
        )

    @property
    def migration_name_fragment(self) -> str:
        return f"move_fence_{self.model_name_lower}"

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        kwargs: dict[str, Any] = {
            "model_name": self.model_name,
            "old": self.old.as_dict(),
            "new": self.new.as_dict(),
        }
        if self.sql is not None:
            kwargs["sql"] = Statements(self.sql)
        if self.reverse_sql is not None:
            kwargs["reverse_sql"] = Statements(self.reverse_sql)
        return type(self).__name__, [], kwargs
