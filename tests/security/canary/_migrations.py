"""Every alembic operation (from alembic's registry of fencekit's operations) and every Django
operation (from fencekit.django.operations), with plausible arguments per target table, and a
runner for each. A new operation with no builder fails the matrix with a message that says to
add one here."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg

from tests.security.canary.conftest import UNPROTECTED, Table, spec_of


def _moved(table: Table) -> Any:
    spec = spec_of(table)
    return spec.with_changes(
        **({"scope": "row", "key": ()} if table.scope == "key" else {"scope": "key", "key": ("k",)})
    )


def alembic_ops() -> dict[str, Any]:
    """Every operation class fencekit registers with alembic that has an implementation."""
    from alembic.operations import Operations

    from fencekit.alembic_plugin import ops

    registered = {}
    for name, obj in vars(ops).items():
        if isinstance(obj, type) and obj.__module__ == ops.__name__:
            try:
                Operations._to_impl.dispatch(obj)
            except ValueError:
                continue
            registered[name] = obj
    return registered


def alembic_instances(name: str, cls: Any, table: Table) -> list[Any] | None:
    from fencekit import sqlgen
    from fencekit.spec import TableName
    from fencekit.sqlgen import FenceChange

    spec = spec_of(table)
    builders: dict[str, Any] = {
        "InstallCoreOp": lambda: [cls(sqlgen.CORE_VERSION)],
        # from the version before: the same version has nothing to upgrade
        "UpgradeCoreOp": lambda: [cls(sqlgen.CORE_VERSION - 1, sqlgen.CORE_VERSION)],
        "UninstallCoreOp": lambda: [cls(sqlgen.CORE_VERSION)],
        "CreateFenceOp": lambda: (
            [cls(FenceChange(None, spec_of(u))) for u in UNPROTECTED]
            + [cls(FenceChange(None, spec))]
        ),
        "DropFenceOp": lambda: [cls(FenceChange(spec, None))],
        "AlterFenceOp": lambda: [cls(FenceChange(spec, _moved(table)))],
        "RenameFenceOp": lambda: [cls(spec, TableName("app", table.name + "_renamed"))],
    }
    return builders[name]() if name in builders else None


def missing_alembic_builders() -> list[str]:
    found = alembic_ops()
    assert found, "no alembic operation found"
    return [n for n, c in found.items() if alembic_instances(n, c, UNPROTECTED[0]) is None]


@contextlib.contextmanager
def alembic_runner(dsn: str) -> Iterator[Any]:
    """``run(op)``: one alembic operation in its own transaction; the error it raised, if any."""
    from alembic.migration import MigrationContext
    from alembic.operations import Operations
    from sqlalchemy import create_engine

    engine = create_engine(dsn.replace("postgresql://", "postgresql+psycopg://", 1))

    def run(op: Any) -> BaseException | None:
        try:
            with engine.begin() as conn:
                Operations(MigrationContext.configure(conn)).invoke(op)
        except Exception as exc:
            return exc
        return None

    try:
        yield run
    finally:
        engine.dispose()


class Editor:
    """What a Django operation needs of a schema editor, on a real psycopg connection."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.connection = type("C", (), {"vendor": "postgresql", "alias": "default"})()

    def execute(self, sql: str, params: Any = None) -> None:
        self.conn.execute(sql.encode())


def django_ops() -> dict[str, Any]:
    from django.conf import settings

    if not settings.configured:
        settings.configure(DATABASES={}, INSTALLED_APPS=[])
    from fencekit.django import operations as dj

    found = {
        n: c
        for n, c in vars(dj).items()
        if isinstance(c, type)
        and issubclass(c, dj._FencekitOperation)
        and c.__module__ == dj.__name__
        and not n.startswith("_")
    }
    assert found, "no Django operation found"
    return found


def django_instances(name: str, cls: Any, table: Table) -> list[Any] | None:
    from fencekit import sqlgen

    spec = spec_of(table)
    return {
        "InstallFencekit": lambda: [cls(sqlgen.CORE_VERSION)],
        "ProtectTable": lambda: [cls("m", spec_of(u)) for u in UNPROTECTED] + [cls("m", spec)],
        "UnprotectTable": lambda: [cls("m", spec)],
        "MoveFence": lambda: [cls("m", spec, _moved(table))],
    }.get(name, lambda: None)()


def missing_django_builders() -> list[str]:
    return [n for n, c in django_ops().items() if django_instances(n, c, UNPROTECTED[0]) is None]


def run_django(dsn: str, op: Any) -> BaseException | None:
    """One Django operation on a connection of its own, committed; the error it raised."""
    with psycopg.connect(dsn) as conn:
        op._allowed = lambda *a: True
        try:
            op.database_forwards("shop", Editor(conn), None, None)
            conn.commit()
        except Exception as exc:
            return exc
    return None
