"""A fence migration carries the SQL it runs, frozen when autogenerate wrote it.

fencekit renders only its current template. These tests change the template under a migration
that is already written (a fencekit release, simulated in every alembic subprocess by
``fencekit_next_template.py``) and check that the migration still upgrades and downgrades
exactly what it froze, and that autogenerate then proposes a migration re-protecting the tables
with the new template.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import psycopg
import pytest

from fencekit import sqlgen
from fencekit.spec import FenceSpec, Scope, TableName
from tests.alembic.conftest import Project
from tests.alembic.test_roundtrip import MODELS, registry, write

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)

BILLING = FenceSpec(TableName("public", "billing_summary"), Scope.KEY, key=("account_id",))
JOBS = FenceSpec(TableName("public", "jobs"))

# Imported by env.py before the migrations run: fencekit as if a release had changed the
# per-table template. Every trigger function gains a first line, and the template version goes
# up by one (re-protect then replaces the objects; the registry records it).
NEXT_TEMPLATE = """
from dataclasses import replace

from fencekit import sqlgen
from fencekit.sqlgen import objects, protect, script

MARK = "-- rendered by the next fence template"
NEXT = objects.TEMPLATE_VERSION + 1


def _next(scope_objects):
    def objects_of_the_next_template(*args, **kwargs):
        functions, triggers = scope_objects(*args, **kwargs)
        return [replace(f, body=MARK + "\\n" + f.body) for f in functions], triggers

    return objects_of_the_next_template


for scope in ("statement_objects", "row_objects", "key_objects"):
    setattr(protect, scope, _next(getattr(protect, scope)))
for module in (sqlgen, objects, protect, script):
    module.TEMPLATE_VERSION = NEXT
"""
MARK = "-- rendered by the next fence template"


def frozen_sql(path: Path) -> dict[tuple[str, str, str], tuple[str, ...]]:
    """``(upgrade|downgrade, operation, table) -> sql=`` of every fence operation in a file."""
    out: dict[tuple[str, str, str], tuple[str, ...]] = {}
    for fn in ast.parse(path.read_text()).body:
        if not isinstance(fn, ast.FunctionDef) or fn.name not in ("upgrade", "downgrade"):
            continue
        for node in ast.walk(fn):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr.endswith("_fence")
            ):
                kwargs = {k.arg: k.value for k in node.keywords}
                table = ast.literal_eval(node.args[0])
                out[(fn.name, node.func.attr, table)] = ast.literal_eval(kwargs["sql"])
    return out


def block(text: str, name: str) -> str:
    upgrade, downgrade = text.split("def upgrade", 1)[1].split("def downgrade", 1)
    return upgrade if name == "upgrade" else downgrade


def function_sources(project: Project) -> dict[str, str]:
    """Every trigger function of a protected table: name -> source."""
    with project.connect() as conn:
        rows = conn.execute(
            "SELECT p.proname, p.prosrc FROM pg_proc p JOIN fencekit.protected r "
            "ON p.proname LIKE r.tag || '\\_%' "
            "WHERE p.pronamespace = 'fencekit'::regnamespace "
            "AND p.prorettype = 'trigger'::regtype ORDER BY p.proname"
        ).fetchall()
    return dict(rows)


def template_versions(project: Project) -> set[int]:
    return {tv for _, tv in registry(project).values()}


def as_printed(statement: str) -> str:
    """A statement as ``alembic upgrade --sql`` prints it."""
    return statement.strip().rstrip(";") + ";"


def upgrade_fencekit(project: Project) -> None:
    """From now on every alembic command of the project runs on the next template."""
    (project.root / "fencekit_next_template.py").write_text(NEXT_TEMPLATE)
    env = project.root / "migrations" / "env.py"
    env.write_text("import fencekit_next_template  # noqa: F401\n" + env.read_text())


def test_autogenerate_freezes_readable_sql(project: Project) -> None:
    start = project.pg_dump_schema()
    project.write_models(MODELS)
    path = project.autogenerate("fences")
    text = path.read_text()
    frozen = frozen_sql(path)
    # Exactly what the generator renders, both ways; nothing else carries a template.
    assert frozen[("upgrade", "create_fence", "billing_summary")] == tuple(
        sqlgen.protect_statements(BILLING)
    )
    assert frozen[("upgrade", "create_fence", "jobs")] == tuple(sqlgen.protect_statements(JOBS))
    assert frozen[("downgrade", "drop_fence", "jobs")] == tuple(sqlgen.unprotect_statements(JOBS))
    assert "template_version=" not in text  # the SQL is the record, not a template number
    # Readable: one SQL line per source line, the statements a reviewer knows from psql.
    assert re.search(r'^ +"BEGIN\\n"$', text, re.M)
    assert re.search(r'^ +"CREATE OR REPLACE FUNCTION fencekit\.\S+_stmt\(\) RETURNS', text, re.M)
    assert re.search(r"""^ +"SELECT fencekit\.ensure_counters\('[^']+'\)",?$""", text, re.M)

    project.alembic("upgrade", "head")
    with project.connect() as conn:
        write(conn, 34, "INSERT INTO jobs VALUES (1, 'B')")
        with pytest.raises(psycopg.Error) as err:
            write(conn, 33, "UPDATE jobs SET state = 'A'")
        assert err.value.sqlstate == "YF001"
    again = project.autogenerate("nothing")
    assert "op." not in block(again.read_text(), "upgrade")
    again.unlink()
    project.alembic("downgrade", "base")
    assert project.pg_dump_schema() == start


def test_migration_replays_its_frozen_sql_after_the_template_changes(project: Project) -> None:
    start = project.pg_dump_schema()
    project.write_models(MODELS)
    path = project.autogenerate("fences")  # today's template
    frozen = frozen_sql(path)
    today = sqlgen.TEMPLATE_VERSION

    # fencekit upgrades: the template of the migration's operations is gone.
    upgrade_fencekit(project)

    # Offline, the migration prints exactly its frozen statements, both ways.
    up = project.alembic("upgrade", "head", "--sql").stdout
    down = project.alembic("downgrade", "head:base", "--sql").stdout
    for (direction, _, _), statements in frozen.items():
        script = up if direction == "upgrade" else down
        for statement in statements:
            assert as_printed(statement) in script
    assert MARK not in up
    assert MARK not in down

    project.alembic("upgrade", "head")
    assert template_versions(project) == {today}
    sources = function_sources(project)
    frozen_text = "\n".join(s for statements in frozen.values() for s in statements)
    assert sources
    for name, source in sources.items():
        assert MARK not in source, name
        assert source in frozen_text, name  # the body the migration froze, verbatim
    with project.connect() as conn:
        write(conn, 34, "INSERT INTO billing_summary VALUES (42, 'B')")
        with pytest.raises(psycopg.Error) as err:
            write(conn, 33, "UPDATE billing_summary SET summary = 'A'")
        assert err.value.sqlstate == "YF001"

    # The upgraded fencekit proposes re-protecting both tables with its template.
    assert project.alembic("check", check=False).returncode != 0
    refresh = project.autogenerate("fencekit upgrade")
    text = refresh.read_text()
    upgrade, downgrade = block(text, "upgrade"), block(text, "downgrade")
    assert upgrade.count("op.alter_fence(") == 2
    assert f"objects of fence template {today}: re-protect it with template {today + 1}" in upgrade
    assert MARK in upgrade
    assert "op.create_fence" not in text
    assert "op.drop_fence" not in text
    assert downgrade.count("sql=(),") == 2  # the old template cannot be rendered: keep the new
    project.alembic("upgrade", "head")
    assert template_versions(project) == {today + 1}
    sources = function_sources(project)
    assert sources
    assert all(source.startswith(MARK) for source in sources.values())
    with project.connect() as conn:
        with pytest.raises(psycopg.Error) as err:
            write(conn, 33, "UPDATE billing_summary SET summary = 'A'")
        assert err.value.sqlstate == "YF001"
    again = project.autogenerate("nothing")
    assert "op." not in block(again.read_text(), "upgrade")
    again.unlink()
    project.alembic("check")

    # Downgrade: the refresh keeps the new objects, then the first migration's frozen
    # unprotect removes them (it drops fencekit's objects of any generation).
    project.alembic("downgrade", "-1")
    assert template_versions(project) == {today + 1}
    project.alembic("downgrade", "base")
    assert project.pg_dump_schema() == start

    # From scratch: old frozen SQL, then the refresh.
    project.alembic("upgrade", "head")
    assert template_versions(project) == {today + 1}
    assert all(source.startswith(MARK) for source in function_sources(project).values())
    project.alembic("downgrade", "base")
    assert project.pg_dump_schema() == start
