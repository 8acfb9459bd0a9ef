"""Alembic operations for fences: ``op.create_fence``, ``op.alter_fence``, ``op.drop_fence``,
``op.rename_fence``, and the core's ``op.install_fencekit`` and ``op.upgrade_fencekit``.

The fence operations are one model (:class:`fencekit.sqlgen.FenceChange`, the change from
spec ``old`` to spec ``new`` that Django and ``fencekit move`` make too) and carry the SQL it
runs each way, frozen into the migration file when autogenerate writes it. Upgrade and
downgrade run those statements, so an old migration does what it did when it was written
although fencekit renders only its current template. No fence SQL is decided here: an
operation written by hand without ``sql=`` renders :func:`fencekit.sqlgen.change_statements`
when it runs. Offline (``alembic upgrade --sql``) the same statements are printed for a DBA to
review and run with psql.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

from alembic.operations import MigrateOperation, Operations

from fencekit import sqlgen
from fencekit.errors import SpecError
from fencekit.ident import quote_ident
from fencekit.spec import DEFAULT_SCHEMA, FenceSpec, TableName
from fencekit.sqlgen.change import FenceChange, frozen_statements
from fencekit.sqlgen.pin import pinned

__all__ = [
    "AlterFenceOp",
    "CreateFenceOp",
    "DropFenceOp",
    "FenceOp",
    "InstallCoreOp",
    "RenameFenceOp",
    "UninstallCoreOp",
    "UpgradeCoreOp",
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


class FenceOp(MigrateOperation):
    """One change of a table's fence (:class:`fencekit.sqlgen.FenceChange`: ``old`` ->
    ``new``, either side ``None`` for "not protected") and the SQL each way.

    The three fence operations are this one model named three ways, as alembic_utils puts
    every entity behind generic create, drop and replace operations: ``create_fence`` (no
    ``old``), ``drop_fence`` (no ``new``) and ``alter_fence`` (both). Upgrade runs the SQL
    frozen into the migration file when autogenerate wrote it, whatever fencekit's templates
    have become since; the reverse runs the other way's frozen SQL. An operation written by
    hand without ``sql`` renders :func:`fencekit.sqlgen.change_statements` when it runs.

    ``note`` / ``undo_note``: a comment autogenerate writes above the operation and above its
    reverse (why a same-spec alter is there, why its downgrade runs nothing).
    """

    name: ClassVar[str]

    def __init__(
        self, change: FenceChange, *, note: str | None = None, undo_note: str | None = None
    ) -> None:
        self.change = change
        self.note = note
        self.undo_note = undo_note

    @staticmethod
    def of(
        change: FenceChange, *, note: str | None = None, undo_note: str | None = None
    ) -> FenceOp:
        """The operation that makes ``change``: create, drop or alter."""
        if change.old is None:
            return CreateFenceOp(change, note=note, undo_note=undo_note)
        if change.new is None:
            return DropFenceOp(change, note=note, undo_note=undo_note)
        return AlterFenceOp(change, note=note, undo_note=undo_note)

    @staticmethod
    def generate(old: FenceSpec | None, new: FenceSpec | None) -> FenceOp:
        """The operation autogenerate writes: the change and its reverse, both frozen now."""
        return FenceOp.of(FenceChange.generate(old, new))

    @property
    def spec(self) -> FenceSpec:
        return self.change.spec

    @property
    def old(self) -> FenceSpec | None:
        return self.change.old

    @property
    def new(self) -> FenceSpec | None:
        return self.change.new

    @property
    def sql(self) -> tuple[str, ...] | None:
        return self.change.sql

    @property
    def undo_sql(self) -> tuple[str, ...] | None:
        return self.change.undo_sql

    def statements(self) -> list[str]:
        """What this operation runs: its frozen SQL, else the current template's."""
        return self.change.statements()

    def reverse(self) -> FenceOp:
        return FenceOp.of(self.change.reverse(), note=self.undo_note, undo_note=self.note)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        table = self.change.table
        return (self.name, table.schema, table.name, self.old, self.new)

    def __repr__(self) -> str:
        frozen = "current template" if self.sql is None else f"{len(self.sql)} frozen statements"
        return f"{type(self).__name__}({self.old!r} -> {self.new!r}, {frozen})"


@Operations.register_operation("create_fence")
class CreateFenceOp(FenceOp):
    """Protect a table: fence column (row fences), check functions, then triggers."""

    name = "create_fence"

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
        spec = spec_from_options(table_name, schema, options)
        operations.invoke(cls(FenceChange(None, spec, sql)))


@Operations.register_operation("drop_fence")
class DropFenceOp(FenceOp):
    """Unprotect a table: triggers, functions, fence column, counters, registry row."""

    name = "drop_fence"

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
        spec = spec_from_options(table_name, schema, options)
        operations.invoke(cls(FenceChange(spec, None, sql)))


@Operations.register_operation("alter_fence")
class AlterFenceOp(FenceOp):
    """Change a table's fence from ``old`` to ``new`` in one transaction, never unprotected in
    between: new policies or issuer in place, another scope, key, resource or fence column
    with the fences carried over conservatively (see :mod:`fencekit.sqlgen.move`); the same
    spec both sides re-protects with a newer template. ``old`` must be what the registry
    holds; the SQL refuses otherwise."""

    name = "alter_fence"

    @classmethod
    def refresh(cls, spec: FenceSpec, from_template: int) -> AlterFenceOp:
        """Re-protect a table whose objects an older template made (same spec both sides).

        Its downgrade runs nothing: this fencekit cannot render the older template (the
        migration that installed those objects froze it), and the current objects enforce
        the same spec. Unprotecting removes objects of any generation.
        """
        now = sqlgen.TEMPLATE_VERSION
        return cls(
            FenceChange(spec, spec, sqlgen.change_statements(spec, spec), ()),
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
        """Change the fence of ``schema.table_name`` from spec ``old`` to spec ``new``.

        ``sql`` as for :meth:`CreateFenceOp.create_fence`.
        """
        before = spec_from_options(table_name, schema, old)
        after = spec_from_options(table_name, schema, new)
        operations.invoke(cls(FenceChange(before, after, sql)))


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


@Operations.implementation_for(CreateFenceOp)
@Operations.implementation_for(DropFenceOp)
@Operations.implementation_for(AlterFenceOp)
def _change(operations: Operations, operation: FenceOp) -> None:
    run_sql(operations, operation.statements(), operation.change.describe())


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
        self.sql = frozen_statements(sql)
        self.undo_sql = frozen_statements(undo_sql, "undo_sql")

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
        f"({operation.spec.scope} fence, "
        f"{'current template' if operation.sql is None else 'frozen SQL'})"
    )
    run_sql(operations, operation.statements(), title)
