"""Alembic operations for fences: ``op.create_fence``, ``op.alter_fence``, ``op.drop_fence``,
``op.install_fencekit`` and ``op.upgrade_fencekit``.

Every operation is reversible (autogenerate writes its downgrade) and runs exactly the SQL of
``fencekit.sqlgen``: no fence SQL is written here. Each records the template version it was
generated with, as an explicit argument in the migration file, so an old migration replays the
SQL it was written with after fencekit upgrades. Offline (``alembic upgrade --sql``) the same
statements are printed for a DBA to review and run with psql.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from alembic.operations import MigrateOperation, Operations

from fencekit import sqlgen
from fencekit.spec import DEFAULT_SCHEMA, FenceSpec, SpecError

__all__ = [
    "AlterFenceOp",
    "CreateFenceOp",
    "DropFenceOp",
    "FenceOp",
    "InstallCoreOp",
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
    options = spec.to_dict()
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
    """
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


def _check_template_version(version: int) -> int:
    if isinstance(version, bool) or not isinstance(version, int):
        raise TypeError(f"template_version must be an int, not {version!r}")
    if not 1 <= version <= sqlgen.TEMPLATE_VERSION:
        raise ValueError(
            f"template_version={version} is not known to this fencekit (it knows 1 to "
            f"{sqlgen.TEMPLATE_VERSION}): upgrade fencekit to run this migration"
        )
    return version


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
    """A fence operation on one table: its spec and the template version that renders it."""

    def __init__(self, spec: FenceSpec, template_version: int) -> None:
        self.spec = spec
        self.template_version = template_version

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r}, template_version={self.template_version})"


@Operations.register_operation("create_fence")
class CreateFenceOp(FenceOp):
    """Protect a table: fence column (row fences), check function, then triggers."""

    @classmethod
    def create_fence(
        cls,
        operations: Operations,
        table_name: str,
        *,
        schema: str | None = None,
        template_version: int,
        **options: Any,
    ) -> None:
        """Protect ``schema.table_name`` with a fence; options as in ``FenceSpec``."""
        spec = spec_from_options(table_name, schema, options)
        operations.invoke(cls(spec, _check_template_version(template_version)))

    def reverse(self) -> DropFenceOp:
        return DropFenceOp(self.spec, self.template_version)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("create_fence", self.spec.table.schema, self.spec.table.name, self.spec)


@Operations.register_operation("drop_fence")
class DropFenceOp(FenceOp):
    """Unprotect a table: triggers, then the check function, then the fence column."""

    @classmethod
    def drop_fence(
        cls,
        operations: Operations,
        table_name: str,
        *,
        schema: str | None = None,
        template_version: int,
        **options: Any,
    ) -> None:
        """Remove the fence of ``schema.table_name``; the full spec makes it reversible."""
        spec = spec_from_options(table_name, schema, options)
        operations.invoke(cls(spec, _check_template_version(template_version)))

    def reverse(self) -> CreateFenceOp:
        return CreateFenceOp(self.spec, self.template_version)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("drop_fence", self.spec.table.schema, self.spec.table.name, self.spec)


@Operations.register_operation("alter_fence")
class AlterFenceOp(MigrateOperation):
    """Change a table's fence (key, scope, policies) or re-render it with a newer template."""

    def __init__(
        self,
        old: FenceSpec,
        old_template_version: int,
        new: FenceSpec,
        template_version: int,
    ) -> None:
        if old.table != new.table:
            raise SpecError(f"alter_fence cannot move a fence from {old.table} to {new.table}")
        self.old = old
        self.old_template_version = old_template_version
        self.new = new
        self.template_version = template_version

    @classmethod
    def alter_fence(
        cls,
        operations: Operations,
        table_name: str,
        *,
        schema: str | None = None,
        old: Mapping[str, Any],
        old_template_version: int,
        new: Mapping[str, Any],
        template_version: int,
    ) -> None:
        """Replace the fence ``old`` of ``schema.table_name`` with ``new``."""
        operations.invoke(
            cls(
                spec_from_options(table_name, schema, old),
                _check_template_version(old_template_version),
                spec_from_options(table_name, schema, new),
                _check_template_version(template_version),
            )
        )

    def reverse(self) -> AlterFenceOp:
        return AlterFenceOp(self.new, self.template_version, self.old, self.old_template_version)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        table = self.new.table
        return ("alter_fence", table.schema, table.name, self.old, self.new)

    def __repr__(self) -> str:
        return (
            f"AlterFenceOp({self.old!r} v{self.old_template_version} -> "
            f"{self.new!r} v{self.template_version})"
        )


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
    uninstall: Callable[[], list[str]] | None = getattr(sqlgen, "uninstall_statements", None)
    if uninstall is None:
        raise NotImplementedError(
            "this fencekit cannot generate the core uninstall yet; remove the "
            "op.uninstall_fencekit(...) line to keep the core, or drop schema fencekit by hand"
        )
    run_sql(operations, uninstall(), "uninstall core")


@Operations.implementation_for(UpgradeCoreOp)
def _upgrade(operations: Operations, operation: UpgradeCoreOp) -> None:
    if operation.to_version <= operation.from_version:
        return  # the core never downgrades: an older fencekit runs on a newer core
    _check_core_version(operation.to_version)
    title = f"upgrade core {operation.from_version} -> {sqlgen.CORE_VERSION}"
    run_sql(operations, sqlgen.install_statements(), title)


@Operations.implementation_for(CreateFenceOp)
def _create(operations: Operations, operation: CreateFenceOp) -> None:
    spec, tv = operation.spec, operation.template_version
    title = f"protect {spec.table.sql} ({spec.scope} fence, template {tv})"
    run_sql(operations, sqlgen.protect_statements(spec, tv), title)


@Operations.implementation_for(DropFenceOp)
def _drop(operations: Operations, operation: DropFenceOp) -> None:
    spec, tv = operation.spec, operation.template_version
    title = f"unprotect {spec.table.sql} ({spec.scope} fence, template {tv})"
    run_sql(operations, sqlgen.unprotect_statements(spec, tv), title)


def _shape(spec: FenceSpec, template_version: int) -> tuple[object, ...]:
    """What protect creates besides function bodies: functions, triggers, column, resource."""
    objs = sqlgen.table_objects(spec, template_version)
    triggers = tuple(
        (t.name, t.timing, t.level, t.when, t.referencing, t.on_partitions, t.function.name)
        for t in objs.triggers
    )
    functions = tuple(f.name for f in objs.functions)
    return (spec.scope, spec.key, spec.column, spec.resource, spec.issuer, functions, triggers)


def alter_statements(operation: AlterFenceOp) -> list[str]:
    """The generator's SQL for an alter.

    When only the policies change (same template, same functions, triggers, column and
    resource), re-running protect is the alter: it replaces the function bodies and the
    registry row in place and keeps every fence. Otherwise the old fence is unprotected and the
    new one protected, which starts the table's fences afresh (a new key has no old fences).
    """
    old, new = operation.old, operation.new
    old_tv, new_tv = operation.old_template_version, operation.template_version
    generated: Callable[..., list[str]] | None = getattr(sqlgen, "alter_statements", None)
    if generated is not None:
        return generated(old, new, old_template_version=old_tv, template_version=new_tv)
    if old_tv == new_tv and _shape(old, old_tv) == _shape(new, new_tv):
        return sqlgen.protect_statements(new, new_tv)
    return [*sqlgen.unprotect_statements(old, old_tv), *sqlgen.protect_statements(new, new_tv)]


@Operations.implementation_for(AlterFenceOp)
def _alter(operations: Operations, operation: AlterFenceOp) -> None:
    new, tv = operation.new, operation.template_version
    title = f"alter the fence of {new.table.sql} ({new.scope} fence, template {tv})"
    run_sql(operations, alter_statements(operation), title)
