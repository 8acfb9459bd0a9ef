"""Alembic operations for fences: ``op.create_fence``, ``op.alter_fence``, ``op.drop_fence``,
``op.install_fencekit`` and ``op.upgrade_fencekit``.

A fence operation carries its spec (for autogenerate's comparison and for reversal) and the
SQL it runs, frozen into the migration file when autogenerate writes it: the exact statements
``fencekit.sqlgen`` produced then. Upgrade and downgrade run those statements, so an old
migration does what it did when it was written although fencekit renders only its current
template; nothing is re-derived at run time. No fence SQL is written here: it all comes from
``sqlgen``, frozen or (for an operation written by hand without ``sql=``) rendered when it
runs. Offline (``alembic upgrade --sql``) the same statements are printed for a DBA to review
and run with psql.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from alembic.operations import MigrateOperation, Operations

from fencekit import sqlgen
from fencekit.errors import SpecError
from fencekit.ident import quote_ident
from fencekit.spec import DEFAULT_SCHEMA, FenceSpec, TableName
from fencekit.sqlgen.pin import pinned

__all__ = [
    "AlterFenceOp",
    "CreateFenceOp",
    "DropFenceOp",
    "FenceOp",
    "InstallCoreOp",
    "MoveFenceOp",
    "RenameFenceOp",
    "UninstallCoreOp",
    "UpgradeCoreOp",
    "alter_statements",
    "run_sql",
    "spec_from_options",
    "spec_options",
]


# ---------------------------------------------------------------- spec <-> operation arguments


def spec_options(spec: FenceSpec) -> dict[str, Any]:
    """The spec's options as migration-file keyword arguments (the table is passed apart)."""
    options = spec.as_dict()
    del options["table"]
    return options


def spec_from_options(table_name: str, schema: str | None, options: Mapping[str, Any]) -> FenceSpec:
    """Rebuild a spec from what a migration file says; unknown options are an error."""
    if "table" in options:
        raise SpecError("pass the table as the first argument (and schema=...), not table=...")
    known = set(spec_options(FenceSpec.from_dict({"table": {"schema": "s", "name": "t"}})))
    unknown = set(options) - known
    if unknown:
        raise SpecError(
            f"unknown fence option(s) {', '.join(sorted(unknown))} for {table_name!r}; "
            f"known: {', '.join(sorted(known))}"
        )
    table = {"schema": schema or DEFAULT_SCHEMA, "name": table_name}
    return FenceSpec.from_dict({**options, "table": table})


# ---------------------------------------------------------------- running SQL, online or offline


def run_sql(operations: Operations, statements: Iterable[str], title: str = "") -> None:
    """Run generated statements verbatim, or print them in offline (``--sql``) mode.

    Verbatim matters: PL/pgSQL bodies contain ``%`` (``format('%I')``, RAISE) and ``:`` that
    SQLAlchemy's ``text()`` and the driver's parameter formatting would rewrite. A DB-API cursor
    given no parameters sends the string untouched, on alembic's connection and transaction.

    The statements run under ``search_path = pg_catalog, pg_temp``, pinned for them and the
    migration's own path restored after (:func:`fencekit.sqlgen.pin.pinned`), so the SQL a
    migration file embeds never binds an operator planted in ``public``.
    """
    statements = pinned(statements)
    context = operations.get_context()
    if context.as_sql:
        impl = context.impl
        if title:
            impl.static_output(f"-- fencekit: {title}")
        for statement in statements:
            impl.static_output(statement.strip().rstrip(";") + impl.command_terminator)
        return
    dbapi_connection = operations.get_bind().connection
    cursor = dbapi_connection.cursor()
    try:
        for statement in statements:
            cursor.execute(statement)
    finally:
        cursor.close()


# ---------------------------------------------------------------- core objects


@Operations.register_operation("install_fencekit")
class InstallCoreOp(MigrateOperation):
    """Install fencekit's core objects (schema ``fencekit``, token reader, registry, ...)."""

    def __init__(self, core_version: int) -> None:
        self.core_version = core_version

    @classmethod
    def install_fencekit(cls, operations: Operations, *, core_version: int) -> None:
        """Install fencekit's core schema (``core_version``: what the migration was written for)."""
        operations.invoke(cls(core_version))

    def reverse(self) -> UninstallCoreOp:
        return UninstallCoreOp(self.core_version)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("install_fencekit", self.core_version)


@Operations.register_operation("uninstall_fencekit")
class UninstallCoreOp(MigrateOperation):
    """Remove fencekit's core objects (the reverse of :class:`InstallCoreOp`)."""

    def __init__(self, core_version: int) -> None:
        self.core_version = core_version

    @classmethod
    def uninstall_fencekit(cls, operations: Operations, *, core_version: int) -> None:
        """Remove fencekit's core schema (every fence must have been dropped first)."""
        operations.invoke(cls(core_version))

    def reverse(self) -> InstallCoreOp:
        return InstallCoreOp(self.core_version)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("uninstall_fencekit", self.core_version)


@Operations.register_operation("upgrade_fencekit")
class UpgradeCoreOp(MigrateOperation):
    """Upgrade the core objects in place from ``from_version`` to ``to_version``.

    The core install is idempotent and upgrades in place; its downgrade is a no-op, because an
    older fencekit runs on a newer core (the core only ever adds).
    """

    def __init__(self, from_version: int, to_version: int) -> None:
        self.from_version = from_version
        self.to_version = to_version

    @classmethod
    def upgrade_fencekit(
        cls, operations: Operations, *, from_version: int, to_version: int
    ) -> None:
        """Upgrade fencekit's core schema in place."""
        operations.invoke(cls(from_version, to_version))

    def reverse(self) -> UpgradeCoreOp:
        return UpgradeCoreOp(self.to_version, self.from_version)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("upgrade_fencekit", self.from_version, self.to_version)


# ---------------------------------------------------------------- fences


def _frozen(sql: Iterable[str] | None, argument: str = "sql") -> tuple[str, ...] | None:
    """A migration's frozen statements as a tuple; None means "render at run time"."""
    if sql is None:
        return None
    if isinstance(sql, (str, bytes)):
        # A string is an iterable of characters: refuse it rather than run one per character.
        raise TypeError(
            f"{argument}= takes a sequence of SQL statements (a tuple of strings), not one "
            "string: fencekit runs each statement as written and never splits a script"
        )
    statements = tuple(sql)
    for statement in statements:
        if not isinstance(statement, str):
            raise TypeError(f"{argument}= holds {statement!r}, not an SQL statement string")
    return statements


class FenceOp(MigrateOperation):
    """A fence operation on one table: its spec and the SQL it runs.

    ``sql`` is frozen into the migration file when autogenerate writes it: upgrade runs those
    statements, whatever fencekit's templates have become since. ``undo_sql`` is what the
    reverse operation runs; it is kept on the object (autogenerate writes it into the reverse
    operation in ``downgrade()``), not rendered twice. An operation written by hand without
    ``sql`` renders the current template when it runs.
    """

    def __init__(
        self,
        spec: FenceSpec,
        sql: Iterable[str] | None = None,
        undo_sql: Iterable[str] | None = None,
    ) -> None:
        self.spec = spec
        self.sql = _frozen(sql)
        self.undo_sql = _frozen(undo_sql, "undo_sql")

    def statements(self) -> list[str]:
        """What this operation runs: its frozen SQL, else the current template's."""
        raise NotImplementedError

    def __repr__(self) -> str:
        frozen = "current template" if self.sql is None else f"{len(self.sql)} frozen statements"
        return f"{type(self).__name__}({self.spec!r}, {frozen})"


@Operations.register_operation("create_fence")
class CreateFenceOp(FenceOp):
    """Protect a table: fence column (row fences), check functions, then triggers."""

    @classmethod
    def generate(cls, spec: FenceSpec) -> CreateFenceOp:
        """The operation autogenerate writes: protect and its undo, frozen now."""
        return cls(spec, sqlgen.protect_statements(spec), sqlgen.unprotect_statements(spec))

    @classmethod
    def create_fence(
        cls,
        operations: Operations,
        table_name: str,
        *,
        schema: str | None = None,
        sql: Sequence[str] | None = None,
        **options: Any,
    ) -> None:
        """Protect ``schema.table_name`` with a fence; options as in ``FenceSpec``.

        ``sql``: the statements to run, frozen when the migration was generated. Without it
        the current template is rendered when the migration runs.
        """
        operations.invoke(cls(spec_from_options(table_name, schema, options), sql))

    def statements(self) -> list[str]:
        return list(self.sql) if self.sql is not None else sqlgen.protect_statements(self.spec)

    def reverse(self) -> DropFenceOp:
        return DropFenceOp(self.spec, self.undo_sql, self.sql)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("create_fence", self.spec.table.schema, self.spec.table.name, self.spec)


@Operations.register_operation("drop_fence")
class DropFenceOp(FenceOp):
    """Unprotect a table: triggers, functions, fence column, counters, registry row."""

    @classmethod
    def generate(cls, spec: FenceSpec) -> DropFenceOp:
        """The operation autogenerate writes: unprotect and its undo, frozen now."""
        return cls(spec, sqlgen.unprotect_statements(spec), sqlgen.protect_statements(spec))

    @classmethod
    def drop_fence(
        cls,
        operations: Operations,
        table_name: str,
        *,
        schema: str | None = None,
        sql: Sequence[str] | None = None,
        **options: Any,
    ) -> None:
        """Remove the fence of ``schema.table_name``; the full spec makes it reversible.

        ``sql`` as for :meth:`CreateFenceOp.create_fence`.
        """
        operations.invoke(cls(spec_from_options(table_name, schema, options), sql))

    def statements(self) -> list[str]:
        return list(self.sql) if self.sql is not None else sqlgen.unprotect_statements(self.spec)

    def reverse(self) -> CreateFenceOp:
        return CreateFenceOp(self.spec, self.undo_sql, self.sql)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("drop_fence", self.spec.table.schema, self.spec.table.name, self.spec)


@Operations.register_operation("alter_fence")
class AlterFenceOp(MigrateOperation):
    """Change a table's fence (key, scope, policies), or re-protect it with a newer template.

    ``note`` / ``undo_note``: a comment autogenerate writes above the operation and above its
    reverse (why a same-spec alter is there, why its downgrade runs nothing).
    """

    def __init__(
        self,
        old: FenceSpec,
        new: FenceSpec,
        sql: Iterable[str] | None = None,
        undo_sql: Iterable[str] | None = None,
        *,
        note: str | None = None,
        undo_note: str | None = None,
    ) -> None:
        if old.table != new.table:
            raise SpecError(f"alter_fence cannot move a fence from {old.table} to {new.table}")
        self.old = old
        self.new = new
        self.sql = _frozen(sql)
        self.undo_sql = _frozen(undo_sql, "undo_sql")
        self.note = note
        self.undo_note = undo_note

    @classmethod
    def generate(cls, old: FenceSpec, new: FenceSpec) -> AlterFenceOp:
        """The operation autogenerate writes for a changed declaration, both ways frozen now."""
        return cls(old, new, alter_statements(old, new), alter_statements(new, old))

    @classmethod
    def refresh(cls, spec: FenceSpec, from_template: int) -> AlterFenceOp:
        """Re-protect a table whose objects an older template made (same spec both sides).

        Its downgrade runs nothing: this fencekit cannot render the older template (the
        migration that installed those objects froze it), and the current objects enforce
        the same spec. Unprotecting removes objects of any generation.
        """
        now = sqlgen.TEMPLATE_VERSION
        return cls(
            spec,
            spec,
            sqlgen.protect_statements(spec),
            (),
            note=(
                f"fencekit: {spec.table.sql} has objects of fence template {from_template}: "
                f"re-protect it with template {now} (same spec)"
            ),
            undo_note=(
                f"fencekit: nothing to undo for {spec.table.sql}: it keeps fence template "
                f"{now}'s objects (same spec), as fencekit no longer renders template "
                f"{from_template}"
            ),
        )

    @classmethod
    def alter_fence(
        cls,
        operations: Operations,
        table_name: str,
        *,
        schema: str | None = None,
        old: Mapping[str, Any],
        new: Mapping[str, Any],
        sql: Sequence[str] | None = None,
    ) -> None:
        """Replace the fence ``old`` of ``schema.table_name`` with ``new``.

        ``sql`` as for :meth:`CreateFenceOp.create_fence`; without it the statements of
        :func:`alter_statements` are rendered when the migration runs.
        """
        operations.invoke(
            cls(
                spec_from_options(table_name, schema, old),
                spec_from_options(table_name, schema, new),
                sql,
            )
        )

    def statements(self) -> list[str]:
        return list(self.sql) if self.sql is not None else alter_statements(self.old, self.new)

    def reverse(self) -> AlterFenceOp:
        return AlterFenceOp(
            self.new,
            self.old,
            self.undo_sql,
            self.sql,
            note=self.undo_note,
            undo_note=self.note,
        )

    def to_diff_tuple(self) -> tuple[Any, ...]:
        table = self.new.table
        return ("alter_fence", table.schema, table.name, self.old, self.new)

    def __repr__(self) -> str:
        frozen = "current template" if self.sql is None else f"{len(self.sql)} frozen statements"
        return f"AlterFenceOp({self.old!r} -> {self.new!r}, {frozen})"


def _shape(spec: FenceSpec) -> tuple[object, ...]:
    """What protect creates besides function bodies: functions, triggers, column, resource."""
    objs = sqlgen.table_objects(spec)
    triggers = tuple(
        (t.name, t.timing, t.level, t.when, t.referencing, t.on_partitions, t.function.name)
        for t in objs.triggers
    )
    functions = tuple(f.name for f in objs.functions)
    return (spec.scope, spec.key, spec.column, spec.resource, spec.issuer, functions, triggers)


def alter_statements(old: FenceSpec, new: FenceSpec) -> list[str]:
    """The current template's SQL that turns fence ``old`` into fence ``new``.

    When only the policies change (same functions, triggers, column and resource), re-running
    protect is the alter: it replaces the function bodies and the registry row in place and
    keeps every fence. Otherwise the table moves to the new spec in one transaction, its
    fences carried over (:func:`fencekit.sqlgen.move_statements`; autogenerate writes that as
    ``op.move_fence``).
    """
    if _shape(old) == _shape(new):
        return sqlgen.protect_statements(new)
    # Another scope, key, resource or fence column: a move, fences carried (never unprotected).
    return sqlgen.move_statements(old, new)


# ---------------------------------------------------------------- implementations


def _check_core_version(version: int) -> None:
    if version > sqlgen.CORE_VERSION:
        raise ValueError(
            f"this migration needs fencekit core version {version}, but this fencekit installs "
            f"version {sqlgen.CORE_VERSION}: upgrade fencekit to run it"
        )


@Operations.implementation_for(InstallCoreOp)
def _install(operations: Operations, operation: InstallCoreOp) -> None:
    # The core install is idempotent and upgrades in place, so an older migration installs the
    # newest core: an older fencekit's tables and functions are a subset of it.
    _check_core_version(operation.core_version)
    run_sql(operations, sqlgen.install_statements(), f"install core {sqlgen.CORE_VERSION}")


@Operations.implementation_for(UninstallCoreOp)
def _uninstall(operations: Operations, operation: UninstallCoreOp) -> None:
    run_sql(operations, sqlgen.uninstall_statements(), "uninstall core")


@Operations.implementation_for(UpgradeCoreOp)
def _upgrade(operations: Operations, operation: UpgradeCoreOp) -> None:
    if operation.to_version <= operation.from_version:
        return  # the core never downgrades: an older fencekit runs on a newer core
    _check_core_version(operation.to_version)
    title = f"upgrade core {operation.from_version} -> {sqlgen.CORE_VERSION}"
    run_sql(operations, sqlgen.install_statements(), title)


def _origin(sql: tuple[str, ...] | None) -> str:
    if sql is None:
        return f"rendered with the current template {sqlgen.TEMPLATE_VERSION}"
    return "SQL frozen in the migration"


@Operations.implementation_for(CreateFenceOp)
def _create(operations: Operations, operation: CreateFenceOp) -> None:
    spec = operation.spec
    title = f"protect {spec.table.sql} ({spec.scope} fence, {_origin(operation.sql)})"
    run_sql(operations, operation.statements(), title)


@Operations.implementation_for(DropFenceOp)
def _drop(operations: Operations, operation: DropFenceOp) -> None:
    spec = operation.spec
    title = f"unprotect {spec.table.sql} ({spec.scope} fence, {_origin(operation.sql)})"
    run_sql(operations, operation.statements(), title)


@Operations.implementation_for(AlterFenceOp)
def _alter(operations: Operations, operation: AlterFenceOp) -> None:
    new = operation.new
    title = f"alter the fence of {new.table.sql} ({new.scope} fence, {_origin(operation.sql)})"
    run_sql(operations, operation.statements(), title)


# ---------------------------------------------------------------- rename


@Operations.register_operation("rename_fence")
class RenameFenceOp(MigrateOperation):
    """Move a table's fence to its new name after ``op.rename_table``: registry row, triggers
    and functions (named after the new name), counters, and an unnamed key or table fence's
    fences. Without it the registry keeps the old name and a ``create_fence`` for the new name
    would put a second set of triggers on the table.

    ``spec`` is the fence as protected under the old name. Run it after the table is renamed.
    Written by hand without ``sql``, its reverse expects the table renamed back first; the
    operation autogenerate writes carries a reverse that does not (see :meth:`generate`).
    """

    def __init__(
        self,
        spec: FenceSpec,
        new_table: TableName,
        sql: Iterable[str] | None = None,
        undo_sql: Iterable[str] | None = None,
    ) -> None:
        self.spec = spec
        self.new_table = new_table
        self.sql = _frozen(sql)
        self.undo_sql = _frozen(undo_sql, "undo_sql")

    @property
    def renamed(self) -> FenceSpec:
        """The spec under the new name."""
        return self.spec.with_changes(table=self.new_table)

    @classmethod
    def generate(cls, spec: FenceSpec, new_table: TableName) -> RenameFenceOp:
        """The operation autogenerate writes: the rename and its reverse, frozen now.

        Autogenerate proposes it after the table was renamed by an earlier migration, whose
        downgrade renames the table back after this one's: so the reverse puts the fence back
        under the old name while the table keeps the new one (renaming the table to the old
        name for the move, then back), which is exactly the state the earlier migration left.
        """
        renamed = spec.with_changes(table=new_table)
        to_old = f"ALTER TABLE {new_table.sql} RENAME TO {quote_ident(spec.table.name)}"
        to_new = f"ALTER TABLE {spec.table.sql} RENAME TO {quote_ident(new_table.name)}"
        back = [to_old, *sqlgen.rename_statements(renamed, spec.table), to_new]
        if spec.table.schema != new_table.schema:
            back = sqlgen.rename_statements(renamed, spec.table)  # SET SCHEMA: by hand
        return cls(spec, new_table, sqlgen.rename_statements(spec, new_table), back)

    @classmethod
    def rename_fence(
        cls,
        operations: Operations,
        old_table_name: str,
        new_table_name: str,
        *,
        schema: str | None = None,
        sql: Sequence[str] | None = None,
        **options: Any,
    ) -> None:
        """Move the fence of ``schema.old_table_name`` (options: its spec, as in
        ``create_fence``) to ``schema.new_table_name``, the same table renamed."""
        spec = spec_from_options(old_table_name, schema, options)
        operations.invoke(cls(spec, TableName(spec.table.schema, new_table_name), sql))

    def statements(self) -> list[str]:
        if self.sql is not None:
            return list(self.sql)
        return sqlgen.rename_statements(self.spec, self.new_table)

    def reverse(self) -> RenameFenceOp:
        return RenameFenceOp(self.renamed, self.spec.table, self.undo_sql, self.sql)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("rename_fence", self.spec.table.schema, self.spec.table.name, self.new_table.name)

    def __repr__(self) -> str:
        frozen = "current template" if self.sql is None else f"{len(self.sql)} frozen statements"
        return f"RenameFenceOp({self.spec!r} -> {self.new_table}, {frozen})"


@Operations.implementation_for(RenameFenceOp)
def _rename(operations: Operations, operation: RenameFenceOp) -> None:
    title = (
        f"move the fence of {operation.spec.table.sql} to {operation.new_table.sql} "
        f"({operation.spec.scope} fence, {_origin(operation.sql)})"
    )
    run_sql(operations, operation.statements(), title)


# ---------------------------------------------------------------- move


@Operations.register_operation("move_fence")
class MoveFenceOp(MigrateOperation):
    """Move a table to a fence of another scope, key, resource or fence column in one
    transaction, its fences carried over conservatively (see :mod:`fencekit.sqlgen.move`):
    never unprotected in between, and no row or key ends up below a token the old fence
    accepted. ``old`` must be what the registry holds; the SQL refuses otherwise."""

    def __init__(
        self,
        old: FenceSpec,
        new: FenceSpec,
        sql: Iterable[str] | None = None,
        undo_sql: Iterable[str] | None = None,
    ) -> None:
        if old.table != new.table:
            raise SpecError(f"move_fence keeps the table ({old.table} -> {new.table})")
        self.old = old
        self.new = new
        self.sql = _frozen(sql)
        self.undo_sql = _frozen(undo_sql, "undo_sql")

    @classmethod
    def generate(cls, old: FenceSpec, new: FenceSpec) -> MoveFenceOp:
        """The operation autogenerate writes: the move and its way back, frozen now."""
        return cls(old, new, sqlgen.move_statements(old, new), sqlgen.move_statements(new, old))

    @classmethod
    def move_fence(
        cls,
        operations: Operations,
        table_name: str,
        *,
        schema: str | None = None,
        old: Mapping[str, Any],
        new: Mapping[str, Any],
        sql: Sequence[str] | None = None,
    ) -> None:
        """Move the fence of ``schema.table_name`` from spec ``old`` to spec ``new``.

        ``sql`` as for :meth:`CreateFenceOp.create_fence`.
        """
        operations.invoke(
            cls(
                spec_from_options(table_name, schema, old),
                spec_from_options(table_name, schema, new),
                sql,
            )
        )

    def statements(self) -> list[str]:
        if self.sql is not None:
            return list(self.sql)
        return sqlgen.move_statements(self.old, self.new)

    def reverse(self) -> MoveFenceOp:
        return MoveFenceOp(self.new, self.old, self.undo_sql, self.sql)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        table = self.new.table
        return ("move_fence", table.schema, table.name, self.old, self.new)

    def __repr__(self) -> str:
        frozen = "current template" if self.sql is None else f"{len(self.sql)} frozen statements"
        return f"MoveFenceOp({self.old!r} -> {self.new!r}, {frozen})"


@Operations.implementation_for(MoveFenceOp)
def _move(operations: Operations, operation: MoveFenceOp) -> None:
    old, new = operation.old, operation.new
    title = (
        f"move the fence of {new.table.sql} ({old.scope} -> {new.scope} fence, fences "
        f"carried, {_origin(operation.sql)})"
    )
    run_sql(operations, operation.statements(), title)
