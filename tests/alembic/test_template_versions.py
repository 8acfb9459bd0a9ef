"""A migration written with an older fence template replays that template after fencekit's
templates change, upgrading and downgrading cleanly."""

from __future__ import annotations

import shutil
from pathlib import Path

import psycopg
import pytest

from tests.alembic.conftest import Project
from tests.alembic.test_roundtrip import registry, write

FIXTURES = Path(__file__).parent / "fixtures"

# Loaded by env.py before the migrations run: fencekit as if a release had added template 2,
# whose functions differ from template 1's.
TEMPLATE_2 = """
from dataclasses import replace

from fencekit import sqlgen

MARK = "-- rendered by fence template 2\\n"


def _v2(spec):
    objs = sqlgen._TEMPLATES[1](spec)
    functions = tuple(replace(f, body=f.body + MARK) for f in objs.functions)
    return replace(objs, template_version=2, functions=functions)


sqlgen._TEMPLATES[2] = _v2
sqlgen.TEMPLATE_VERSION = 2
"""


def function_sources(project: Project) -> list[str]:
    with project.connect() as conn:
        rows = conn.execute(
            "SELECT p.prosrc FROM pg_proc p JOIN fencekit.protected r "
            "ON p.proname LIKE r.tag || '%' ORDER BY p.proname"
        ).fetchall()
    return [src for (src,) in rows]


@pytest.fixture
def upgraded_fencekit(project: Project) -> Project:
    (project.root / "fencekit_template_2.py").write_text(TEMPLATE_2)
    env = project.root / "migrations" / "env.py"
    env.write_text("import fencekit_template_2  # noqa: F401\n" + env.read_text())
    return project


def test_v1_migration_replays_template_1_after_upgrade(upgraded_fencekit: Project) -> None:
    project = upgraded_fencekit
    start = project.pg_dump_schema()
    project.write_models((FIXTURES / "v1_models.py").read_text())
    shutil.copy(FIXTURES / "v1_fences.py", project.versions / "0ac44f0b1cf0_fences_v1.py")

    project.alembic("upgrade", "head")
    assert {tv for _, tv in registry(project).values()} == {1}
    sources = function_sources(project)
    assert sources
    assert not any("fence template 2" in src for src in sources)
    with project.connect() as conn:
        write(conn, 34, "INSERT INTO billing_summary VALUES (42, 'B')")
        with pytest.raises(psycopg.Error) as err:
            write(conn, 33, "UPDATE billing_summary SET summary = 'A'")
        assert err.value.sqlstate == "YF001"

    # Same declarations, newer template: autogenerate does not re-render on its own.
    again = project.autogenerate("nothing")
    assert "op." not in again.read_text().split("def upgrade", 1)[1].split("def downgrade")[0]
    again.unlink()

    project.alembic("downgrade", "base")
    assert project.pg_dump_schema() == start


def test_new_fences_use_the_new_template(upgraded_fencekit: Project) -> None:
    project = upgraded_fencekit
    project.write_models((FIXTURES / "v1_models.py").read_text())
    text = project.autogenerate("fences").read_text()
    assert "template_version=2" in text
    assert "template_version=1" not in text
    project.alembic("upgrade", "head")
    assert {tv for _, tv in registry(project).values()} == {2}
    assert all("fence template 2" in src for src in function_sources(project))
    project.alembic("downgrade", "base")
