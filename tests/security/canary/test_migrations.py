"""Canary matrix: every alembic operation (from alembic's registry of fencekit's operations)
and every Django operation (from fencekit.django.operations), run as a superuser, each in a
fresh copy of the planted database. No planted canary may run as anyone but the owner or the
writer."""

from __future__ import annotations

import contextlib
from typing import Any

import psycopg

from tests.security.canary._builders import TARGETS, UNPROTECTED
from tests.security.canary._cells import Matrix
from tests.security.canary.conftest import Planted, spec_of


def _alembic_ops() -> dict[str, Any]:
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


def _alembic_instances(name: str, cls: Any, table: Any) -> list[Any] | None:
    from fencekit import sqlgen
    from fencekit.spec import TableName
    from fencekit.sqlgen import FenceChange

    spec = spec_of(table)
    moved = spec.with_changes(
        **({"scope": "row", "key": ()} if table.scope == "key" else {"scope": "key", "key": ("k",)})
    )
    builders: dict[str, Any] = {
        "InstallCoreOp": lambda: [cls(sqlgen.CORE_VERSION)],
        "UpgradeCoreOp": lambda: [cls(sqlgen.CORE_VERSION, sqlgen.CORE_VERSION)],
        "UninstallCoreOp": lambda: [cls(sqlgen.CORE_VERSION)],
        "CreateFenceOp": lambda: (
            [cls(FenceChange(None, spec_of(u))) for u in UNPROTECTED]
            + [cls(FenceChange(None, spec))]
        ),
        "DropFenceOp": lambda: [cls(FenceChange(spec, None))],
        "AlterFenceOp": lambda: [cls(FenceChange(spec, moved))],
        "RenameFenceOp": lambda: [cls(spec, TableName("app", table.name + "_renamed"))],
    }
    return builders[name]() if name in builders else None


def test_alembic_operations(planted: Planted) -> None:
    from alembic.migration import MigrationContext
    from alembic.operations import Operations
    from sqlalchemy import create_engine

    matrix = Matrix()
    found = _alembic_ops()
    assert found, "no alembic operation found"
    missing = [n for n, c in found.items() if _alembic_instances(n, c, TARGETS[0]) is None]
    assert not missing, (
        f"alembic operations with no argument builder: {missing}; add one to "
        "_alembic_instances in tests/security/canary/test_commands.py"
    )
    for name, cls in found.items():
        with planted.fresh() as db:
            url = planted.dsn(db).replace("postgresql://", "postgresql+psycopg://", 1)
            engine = create_engine(url)
            try:
                for table in TARGETS:
                    for op in _alembic_instances(name, cls, table) or []:
                        before = planted.hits(db)
                        with contextlib.suppress(Exception), engine.begin() as conn:
                            Operations(MigrationContext.configure(conn)).invoke(op)
                        matrix.judge(
                            f"alembic {name} on app.{table.name}", before, planted.hits(db)
                        )
            finally:
                engine.dispose()
    matrix.assert_clean()


class _Editor:
    """What a Django operation needs of a schema editor, on a real psycopg connection."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.connection = type("C", (), {"vendor": "postgresql", "alias": "default"})()

    def execute(self, sql: str, params: Any = None) -> None:
        self.conn.execute(sql.encode())


def test_django_operations(planted: Planted) -> None:
    from django.conf import settings

    if not settings.configured:
        settings.configure(DATABASES={}, INSTALLED_APPS=[])
    from fencekit import sqlgen
    from fencekit.django import operations as dj

    matrix = Matrix()
    found = {
        n: c
        for n, c in vars(dj).items()
        if isinstance(c, type)
        and issubclass(c, dj._FencekitOperation)
        and c.__module__ == dj.__name__
        and not n.startswith("_")
    }
    assert found, "no Django operation found"

    def build(name: str, cls: Any, table: Any) -> list[Any] | None:
        spec = spec_of(table)
        moved = spec.with_changes(
            **(
                {"scope": "row", "key": ()}
                if table.scope == "key"
                else {"scope": "key", "key": ("k",)}
            )
        )
        return {
            "InstallFencekit": lambda: [cls(sqlgen.CORE_VERSION)],
            "ProtectTable": lambda: [cls("m", spec_of(u)) for u in UNPROTECTED] + [cls("m", spec)],
            "UnprotectTable": lambda: [cls("m", spec)],
            "MoveFence": lambda: [cls("m", spec, moved)],
        }.get(name, lambda: None)()

    missing = [n for n, c in found.items() if build(n, c, TARGETS[0]) is None]
    assert not missing, (
        f"Django operations with no argument builder: {missing}; add one to "
        "test_django_operations in tests/security/canary/test_commands.py"
    )
    for name, cls in found.items():
        with planted.fresh() as db:
            for table in TARGETS:
                for op in build(name, cls, table) or []:
                    before = planted.hits(db)
                    with psycopg.connect(planted.dsn(db)) as conn:
                        op._allowed = lambda *a: True
                        with contextlib.suppress(Exception):
                            op.database_forwards("shop", _Editor(conn), None, None)
                            conn.commit()
                    matrix.judge(f"django {name} {op.describe()}", before, planted.hits(db))
    matrix.assert_clean()
