"""GrantFencekitWriter / RevokeFencekitWriter, and makemigrations for FENCEKIT_WRITER_ROLES."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.apps import apps as django_apps
from django.db import connection, migrations
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.state import ProjectState
from django.db.migrations.writer import MigrationWriter

from fencekit.django.autodetect import FenceAutodetector
from fencekit.django.grants import GrantFencekitWriter, RevokeFencekitWriter

APP = "fk_django_grant_app"


def _shop_ops() -> list[Any]:
    loader = MigrationLoader(None, ignore_no_migrations=True)
    detector = FenceAutodetector(loader.project_state(), ProjectState.from_apps(django_apps))
    changes = detector.changes(graph=loader.graph)
    return [op for migration in changes.get("shop", []) for op in migration.operations], [
        dep for migration in changes.get("shop", []) for dep in migration.dependencies
    ]


def test_makemigrations_grants_each_role_of_the_setting_once(settings: Any) -> None:
    settings.FENCEKIT_WRITER_ROLES = [APP]
    ops, deps = _shop_ops()
    grants = [op for op in ops if isinstance(op, GrantFencekitWriter)]
    assert [g.role for g in grants] == [APP]
    assert any(app == "fencekit" for app, _ in deps)  # after the core that creates the role
    # Written as makemigrations writes it, it loads back the same.
    migration = migrations.Migration("0002_grant", "shop")
    migration.operations = grants
    text = MigrationWriter(migration).as_string()
    assert "fencekit.django.grants.GrantFencekitWriter(" in text
    namespace: dict[str, Any] = {}
    exec(compile(text, "<migration>", "exec"), namespace)  # noqa: S102  # Django's writer's output
    (loaded,) = namespace["Migration"]("0002_grant", "shop").operations
    assert isinstance(loaded, GrantFencekitWriter)
    assert loaded.role == APP
    settings.FENCEKIT_WRITER_ROLES = []
    assert not [op for op in _shop_ops()[0] if isinstance(op, GrantFencekitWriter)]


@pytest.mark.django_db(transaction=True)
def test_the_operations_grant_and_revoke(make_django_role: Callable[[str], None]) -> None:
    make_django_role(APP)

    def member() -> bool:
        with connection.cursor() as cur:
            cur.execute("SELECT pg_has_role(%s, 'fencekit_writer', 'MEMBER')", [APP])
            return bool(cur.fetchone()[0])

    grant = GrantFencekitWriter(APP)
    with connection.schema_editor() as editor:
        grant.database_forwards("shop", editor, None, None)
    assert member()
    with connection.schema_editor() as editor:
        grant.database_backwards("shop", editor, None, None)
    assert not member()
    with connection.schema_editor() as editor:
        RevokeFencekitWriter(APP).database_backwards("shop", editor, None, None)
    assert member()
    with connection.schema_editor() as editor:
        RevokeFencekitWriter(APP).database_forwards("shop", editor, None, None)
    assert not member()
    assert GrantFencekitWriter(APP).describe() == f"Grant fencekit_writer to role {APP}"
    with pytest.raises(ValueError, match="login role"):
        GrantFencekitWriter("public")


@pytest.fixture
def make_django_role() -> Any:
    made: list[str] = []

    def make(name: str) -> None:
        with connection.cursor() as cur:
            cur.execute(f'CREATE ROLE "{name}" NOLOGIN')
        made.append(name)

    yield make
    with connection.cursor() as cur:
        for name in made:
            cur.execute(f'DROP ROLE IF EXISTS "{name}"')
