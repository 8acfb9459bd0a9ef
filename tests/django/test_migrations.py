"""Meta.fence through makemigrations, and the operations against the test database.

The shop's 0001 migration in this folder was written by ``makemigrations`` (the fencekit app's
command); a second run must find nothing to do. Changes are detected on states built here, the
way Django's own autodetector tests do, and applied with a schema editor.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.apps import apps as django_apps
from django.core.management import call_command
from django.db import DatabaseError, connection, migrations
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.operations import DeleteModel
from django.db.migrations.state import ProjectState
from django.db.migrations.writer import MigrationWriter

from fencekit import StaleTokenError, fencing, sqlgen
from fencekit.django import Fence
from fencekit.django.autodetect import FenceAutodetector
from fencekit.django.operations import InstallFencekit, MoveFence, ProtectTable, UnprotectTable
from fencekit.errors import translate
from fencekit.spec import FenceSpec, Scope, TableName
from tests.django.shop.models import Account, BillingSummary

SUMMARY = FenceSpec(TableName("public", "shop_billingsummary"), Scope.KEY, key=("account_id",))


def _changes(edit: Any) -> list[Any]:
    """The shop operations makemigrations would write after ``edit(to_state)``."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    to_state = ProjectState.from_apps(django_apps)
    edit(to_state)
    detector = FenceAutodetector(loader.project_state(), to_state)
    changes = detector.changes(graph=loader.graph)
    return [op for migration in changes.get("shop", []) for op in migration.operations]


def _reload(migration: migrations.Migration) -> migrations.Migration:
    """Write ``migration`` as makemigrations would and load the file back."""
    text = MigrationWriter(migration).as_string()
    namespace: dict[str, Any] = {}
    exec(compile(text, "<migration>", "exec"), namespace)  # noqa: S102  # our own writer's output
    loaded: migrations.Migration = namespace["Migration"]("0002_test", "shop")
    return loaded


@pytest.mark.django_db
def test_a_second_makemigrations_is_empty() -> None:
    out = io.StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)  # exits 1 on changes
    assert "No changes detected" in out.getvalue()


def test_makemigrations_froze_the_protect_sql_into_the_migration() -> None:
    loader = MigrationLoader(None, ignore_no_migrations=True)
    migration = loader.disk_migrations["shop", "0001_initial"]
    assert ("fencekit", "0001_install") in migration.dependencies
    protects = {op.model_name: op for op in migration.operations if isinstance(op, ProtectTable)}
    assert set(protects) == {"Job", "BillingSummary"}
    op = protects["BillingSummary"]
    assert op.spec == SUMMARY
    assert list(op.sql) == sqlgen.protect_statements(SUMMARY)
    assert list(op.reverse_sql) == sqlgen.unprotect_statements(SUMMARY)
    # One source line per SQL line, so a reviewer reads SQL in the diff.
    source = django_apps.get_app_config("shop").path + "/migrations/0001_initial.py"
    with open(source) as f:
        text = f.read()
    assert "    'CREATE OR REPLACE FUNCTION fencekit.shop_billingsummary_" in text
    last = [o for o in migration.operations if not isinstance(o, ProtectTable)][-1]
    assert migration.operations.index(last) < migration.operations.index(op)


def test_a_changed_policy_re_protects_in_place() -> None:
    def edit(state: ProjectState) -> None:
        state.models["shop", "billingsummary"].options["fence"] = Fence(
            scope="key", key=["account"], on_equal="reject"
        )

    (op,) = _changes(edit)
    assert isinstance(op, MoveFence)
    new = SUMMARY.with_changes(on_equal="reject")
    assert (op.old, op.new) == (SUMMARY, new)
    # The one change model: protect again behind the move's lock and guard, fences kept.
    assert list(op.sql) == sqlgen.change_statements(SUMMARY, new)
    assert list(op.sql)[-len(sqlgen.protect_statements(new)) :] == sqlgen.protect_statements(new)
    assert list(op.reverse_sql) == sqlgen.change_statements(new, SUMMARY)


def test_a_changed_scope_moves_the_fence_and_round_trips_through_the_writer() -> None:
    def edit(state: ProjectState) -> None:
        state.models["shop", "billingsummary"].options["fence"] = Fence(scope="table")

    (op,) = _changes(edit)
    new = FenceSpec(SUMMARY.table, Scope.TABLE)
    assert isinstance(op, MoveFence)
    assert list(op.sql) == sqlgen.change_statements(SUMMARY, new)
    migration = migrations.Migration("0002_test", "shop")
    migration.operations = [op]
    (loaded,) = _reload(migration).operations
    assert isinstance(loaded, MoveFence)
    assert (loaded.old, loaded.new, loaded.sql, loaded.reverse_sql) == (
        op.old,
        op.new,
        op.sql,
        op.reverse_sql,
    )


def test_a_removed_fence_and_a_deleted_model_unprotect_first() -> None:
    def edit(state: ProjectState) -> None:
        state.models["shop", "job"].options.pop("fence")

    (op,) = _changes(edit)
    assert isinstance(op, UnprotectTable)
    assert op.model_name == "Job"
    assert list(op.sql) == sqlgen.unprotect_statements(FenceSpec(TableName("public", "shop_job")))

    ops = _changes(lambda state: state.remove_model("shop", "job"))
    assert [type(o) for o in ops] == [UnprotectTable, DeleteModel]


def test_a_renamed_fenced_table_is_refused_with_the_way_out() -> None:
    def edit(state: ProjectState) -> None:
        state.models["shop", "job"].options["db_table"] = "shop_jobs"

    with pytest.raises(Exception, match="Renaming a fenced table"):
        _changes(edit)


def _registry() -> dict[str, dict[str, Any]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT table_name, spec FROM fencekit.protected ORDER BY 1")
        return {
            name: spec if isinstance(spec, dict) else json.loads(spec)
            for name, spec in cursor.fetchall()
        }


@pytest.mark.django_db(transaction=True)
def test_the_migrations_reverse_and_apply_again() -> None:
    assert set(_registry()) == {"shop_billingsummary", "shop_job"}
    call_command("migrate", "shop", "zero", verbosity=0)
    assert _registry() == {}
    call_command("migrate", "shop", verbosity=0)
    assert _registry()["shop_billingsummary"]["key"] == ["account_id"]
    sql = io.StringIO()
    call_command("sqlmigrate", "shop", "0001", stdout=sql)
    assert "SET LOCAL lock_timeout = '5s'" in sql.getvalue()
    assert "CREATE OR REPLACE TRIGGER" in sql.getvalue()


@pytest.fixture
def fresh_fences() -> Iterator[None]:
    """A move back to a key fence leaves every key at least at the table's fence (nothing
    below a token it accepted): start the next test from freshly protected tables."""
    yield
    call_command("migrate", "shop", "zero", verbosity=0)
    call_command("migrate", "shop", verbosity=0)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_fences")
def test_move_fence_carries_the_fences_both_ways() -> None:
    account = Account.objects.create(name="moved")
    with fencing(34):
        BillingSummary.objects.create(account=account)
    loader = MigrationLoader(connection)
    before = loader.project_state()
    new = FenceSpec(SUMMARY.table, Scope.TABLE)
    op = MoveFence.generate("BillingSummary", SUMMARY, new)
    after = before.clone()
    op.state_forwards("shop", after)
    with connection.schema_editor() as editor:
        op.database_forwards("shop", editor, before, after)
    assert _registry()["shop_billingsummary"]["scope"] == "table"
    with fencing(33), pytest.raises(DatabaseError) as info:
        BillingSummary.objects.update(total=1)
    assert isinstance(translate(info.value.__cause__), StaleTokenError)
    with connection.schema_editor() as editor:
        op.database_backwards("shop", editor, after, before)
    assert _registry()["shop_billingsummary"]["scope"] == "key"
    with fencing(33), pytest.raises(DatabaseError):
        BillingSummary.objects.update(total=1)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_fences")
def test_a_changed_issuer_binds_the_resource_to_the_new_issuer() -> None:
    """A key fence fed by etcd, then by ZooKeeper: the frozen change rebinds the resource (a
    table alone on its resource may change issuer; only a shared resource keeps its binding)."""
    etcd = SUMMARY.with_changes(issuer="etcd")
    zookeeper = SUMMARY.with_changes(issuer="zookeeper")
    state = MigrationLoader(connection).project_state()
    ops = [
        MoveFence.generate("BillingSummary", a, b) for a, b in ((SUMMARY, etcd), (etcd, zookeeper))
    ]
    for op in ops:
        with connection.schema_editor() as editor:
            op.database_forwards("shop", editor, state, state)
        assert _registry()["shop_billingsummary"]["issuer"] == op.new.issuer
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT issuer FROM fencekit.resources WHERE resource = %s", [SUMMARY.resource_name]
        )
        assert cursor.fetchall() == [("zookeeper",)]
    for op in reversed(ops):
        with connection.schema_editor() as editor:
            op.database_backwards("shop", editor, state, state)
        assert _registry()["shop_billingsummary"]["issuer"] == op.old.issuer


@pytest.mark.django_db(transaction=True)
def test_a_hand_written_operation_renders_the_current_template() -> None:
    loader = MigrationLoader(connection)
    state = loader.project_state()
    unprotect = UnprotectTable("Job", {"table": {"schema": "public", "name": "shop_job"}})
    protect = ProtectTable("Job", {"table": {"schema": "public", "name": "shop_job"}})
    assert unprotect.sql is None
    assert protect.sql is None
    with connection.schema_editor() as editor:
        unprotect.database_forwards("shop", editor, state, state)
    assert "shop_job" not in _registry()
    with connection.schema_editor() as editor:
        protect.database_forwards("shop", editor, state, state)
    assert _registry()["shop_job"]["scope"] == "row"


def test_the_app_migrations_install_the_current_core() -> None:
    """Each core version fencekit installs has its migration in the fencekit app, so that
    ``migrate`` upgrades a database whose earlier migrations installed an older core."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    (leaf,) = loader.graph.leaf_nodes("fencekit")
    installs = [
        op
        for key in loader.graph.forwards_plan(leaf)
        if key[0] == "fencekit"
        for op in loader.disk_migrations[key].operations
        if isinstance(op, InstallFencekit)
    ]
    latest = installs[-1].core_version
    assert latest == sqlgen.CORE_VERSION, (
        f"fencekit installs core {sqlgen.CORE_VERSION}, the fencekit app's migrations stop at "
        f"{latest}: add fencekit/django/migrations/NNNN_core_{sqlgen.CORE_VERSION}.py depending "
        f"on {leaf[1]!r}, with operations = [InstallFencekit(core_version="
        f"{sqlgen.CORE_VERSION}, upgrade_from={latest})] (it upgrades the core in place)"
    )
