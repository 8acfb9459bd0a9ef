"""Django migration operations: ``InstallFencekit``, ``ProtectTable``, ``MoveFence`` and
``UnprotectTable``.

Each fence operation carries its spec (a :meth:`FenceSpec.as_dict` dict) and the SQL it runs,
frozen into the migration file by ``makemigrations``: the statements ``fencekit.sqlgen``
produced then, and the ones its reverse runs. An old migration does what it did when it was
written, whatever fencekit's templates have become since. The three are one model,
:class:`fencekit.sqlgen.FenceChange`, which the alembic operations and ``fencekit move`` share:
an operation written by hand without ``sql=`` renders :func:`fencekit.sqlgen.change_statements`
when it runs. ``sqlmigrate`` prints the statements.

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
from fencekit.spec import FenceSpec
from fencekit.sqlgen.change import FenceChange
from fencekit.sqlgen.pin import pinned
from fencekit.sqlgen.text import lit

__all__ = [
    "InstallFencekit",
    "MoveFence",
    "ProtectTable",
    "Statements",
    "UnprotectTable",
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


def _spec(value: FenceSpec | Mapping[str, Any] | None) -> FenceSpec | None:
    if value is None or isinstance(value, FenceSpec):
        return value
    return FenceSpec.from_dict(dict(value))


def _sql(value: Iterable[str] | None) -> Iterable[str] | None:
    return value.statements if isinstance(value, Statements) else value


def _both_ways(old: FenceSpec | None, new: FenceSpec | None) -> tuple[Any, Any]:
    """The change's SQL and its reverse's, rendered now (what makemigrations freezes)."""
    change = FenceChange.generate(old, new)
    return change.sql, change.undo_sql


_LOCK_TIMEOUT = f"SET LOCAL lock_timeout = {lit(sqlgen.DEFAULT_LOCK_TIMEOUT)}"


class _FencekitOperation(Operation):
    reversible = True
    reduces_to_sql = True

    def _run(self, schema_editor: Any, statements: Iterable[str]) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return
        # No DDL here waits long for its lock (a protect must not queue every writer behind
        # it); the migration's later operations get the server's default back.
        schema_editor.execute(_LOCK_TIMEOUT, params=None)
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


class _FenceOperation(_TableOperation):
    """A change of a model's fence: :class:`fencekit.sqlgen.FenceChange` (spec ``old`` ->
    spec ``new``, ``None`` for "not protected"), the model alembic's operations share."""

    change: FenceChange
    #: The start of the migration name makemigrations derives from the operation.
    fragment: str

    def _init(
        self,
        model_name: str,
        old: FenceSpec | Mapping[str, Any] | None,
        new: FenceSpec | Mapping[str, Any] | None,
        sql: Iterable[str] | None,
        reverse_sql: Iterable[str] | None,
    ) -> None:
        self.model_name = model_name
        self.change = FenceChange(
            _spec(old), _spec(new), _sql(sql), _sql(reverse_sql), undo_argument="reverse_sql"
        )

    @property
    def spec(self) -> FenceSpec:
        """The spec naming the table: the new one, else the old one."""
        return self.change.spec

    @property
    def sql(self) -> tuple[str, ...] | None:
        return self.change.sql

    @property
    def reverse_sql(self) -> tuple[str, ...] | None:
        return self.change.undo_sql

    def state_forwards(self, app_label: str, state: Any) -> None:
        self._set_state(app_label, state, self.change.new)

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        # Ask the router about the model in the state where it is fenced.
        state = from_state if self.change.new is None else to_state
        if self._allowed(schema_editor, state, app_label):
            self._run(schema_editor, self.change.statements())

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        state = from_state if self.change.old is None else to_state
        if self._allowed(schema_editor, state, app_label):
            self._run(schema_editor, self.change.reverse().statements())

    def describe(self) -> str:
        what = self.change.describe()
        return f"{what[0].upper()}{what[1:]} (model {self.model_name})"

    @property
    def migration_name_fragment(self) -> str:
        return f"{self.fragment}_{self.model_name_lower}"

    def _kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"model_name": self.model_name}
        old, new = self.change.old, self.change.new
        if old is not None and new is not None:
            kwargs.update(old=old.as_dict(), new=new.as_dict())
        else:
            kwargs["spec"] = self.change.spec.as_dict()
        if self.sql is not None:
            kwargs["sql"] = Statements(self.sql)
        if self.reverse_sql is not None:
            kwargs["reverse_sql"] = Statements(self.reverse_sql)
        return kwargs

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return type(self).__name__, [], self._kwargs()


class ProtectTable(_FenceOperation):
    """Protect a model's table with a fence: column (row fences), functions, triggers."""

    category = OperationCategory.ADDITION
    fragment = "protect"

    def __init__(
        self,
        model_name: str,
        spec: FenceSpec | Mapping[str, Any],
        sql: Iterable[str] | None = None,
        reverse_sql: Iterable[str] | None = None,
    ) -> None:
        self._init(model_name, None, spec, sql, reverse_sql)

    @classmethod
    def generate(cls, model_name: str, spec: FenceSpec) -> ProtectTable:
        """What makemigrations writes: protect and its undo, frozen now."""
        return cls(model_name, spec, *_both_ways(None, spec))


class UnprotectTable(_FenceOperation):
    """Remove a model's fence (triggers, functions, fence column, counters, registry row).

    The full spec makes it reversible; a row fence's fences are lost with its column.
    """

    category = OperationCategory.REMOVAL
    fragment = "unprotect"

    def __init__(
        self,
        model_name: str,
        spec: FenceSpec | Mapping[str, Any],
        sql: Iterable[str] | None = None,
        reverse_sql: Iterable[str] | None = None,
    ) -> None:
        self._init(model_name, spec, None, sql, reverse_sql)

    @classmethod
    def generate(cls, model_name: str, spec: FenceSpec) -> UnprotectTable:
        """What makemigrations writes: unprotect and its undo, frozen now."""
        return cls(model_name, spec, *_both_ways(spec, None))


class MoveFence(_FenceOperation):
    """Change a model's fence from spec ``old`` to spec ``new`` in one transaction, never
    unprotected in between (:func:`fencekit.sqlgen.change_statements`): new policies or
    issuer in place, another scope, key, resource or fence column with the fences carried
    over. ``old`` must be what the registry holds; the SQL refuses otherwise.
    """

    category = OperationCategory.ALTERATION
    fragment = "move_fence"

    def __init__(
        self,
        model_name: str,
        old: FenceSpec | Mapping[str, Any],
        new: FenceSpec | Mapping[str, Any],
        sql: Iterable[str] | None = None,
        reverse_sql: Iterable[str] | None = None,
    ) -> None:
        self._init(model_name, old, new, sql, reverse_sql)

    @property
    def old(self) -> FenceSpec:
        assert self.change.old is not None
        return self.change.old

    @property
    def new(self) -> FenceSpec:
        assert self.change.new is not None
        return self.change.new

    @classmethod
    def generate(cls, model_name: str, old: FenceSpec, new: FenceSpec) -> MoveFence:
        """What makemigrations writes: the change and its way back, frozen now."""
        return cls(model_name, old, new, *_both_ways(old, new))
