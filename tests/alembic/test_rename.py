"""Renaming a fenced table with alembic: after ``op.rename_table``
autogenerate proposes ``rename_fence`` (not a second ``create_fence``), applying it leaves one
set of fencekit triggers, and a custom fence column (``column=...``) is never reported as a
removed column."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from tests.alembic.conftest import Project

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)

FENCEKIT = str(Path(sys.executable).with_name("fencekit"))

BEFORE = """
from sqlalchemy import Column, Integer, MetaData, Table, Text
from fencekit.declare import declare_fence

metadata = MetaData()
jobs = Table("jobs", metadata, Column("id", Integer, primary_key=True), Column("state", Text))
declare_fence(jobs, scope="key", key=["id"])
"""

AFTER = BEFORE.replace('Table("jobs"', 'Table("tasks"')


def _triggers(project: Project, table: str) -> list[str]:
    with project.connect() as conn:
        rows = conn.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass AND tgname LIKE "
            "'fencekit%%' ORDER BY 1",
            (table,),
        ).fetchall()
    return [r[0] for r in rows]


def _stale(project: Project, table: str) -> str:
    with project.connect() as conn:
        conn.execute("BEGIN")
        conn.execute("SELECT set_config('fencekit.token', '1', true)")
        try:
            conn.execute(f"UPDATE {table} SET state = 'late'")
        except psycopg.Error as exc:
            conn.execute("ROLLBACK")
            return str(getattr(exc, "sqlstate", ""))
        conn.execute("ROLLBACK")
        return "accepted"


def test_rename_table_then_autogenerate_proposes_rename_fence(project: Project) -> None:
    project.write_models(BEFORE)
    project.autogenerate("jobs")
    project.alembic("upgrade", "head")
    with project.connect() as conn:
        conn.execute("BEGIN")
        conn.execute("SELECT set_config('fencekit.token', '5', true)")
        conn.execute("INSERT INTO jobs VALUES (1, 'new')")
        conn.execute("COMMIT")
    n = len(_triggers(project, "jobs"))
    # A hand-written migration renames the table, as alembic's docs show.
    rename = project.versions / "0002_rename.py"
    head = project.alembic("heads").stdout.split()[0]
    rename.write_text(
        "from alembic import op\n"
        f"revision = 'r2'\ndown_revision = {head!r}\nbranch_labels = None\ndepends_on = None\n"
        "def upgrade():\n    op.rename_table('jobs', 'tasks')\n"
        "def downgrade():\n    op.rename_table('tasks', 'jobs')\n"
    )
    project.alembic("upgrade", "head")
    assert _stale(project, "tasks") == "YF001"
    project.write_models(AFTER)
    text = project.autogenerate("follow").read_text()
    upgrade = text.split("def upgrade", 1)[1].split("def downgrade", 1)[0]
    assert "op.rename_fence(" in upgrade
    assert "op.create_fence(" not in upgrade
    assert "op.drop_fence(" not in upgrade
    project.alembic("upgrade", "head")
    triggers = _triggers(project, "tasks")
    assert len(triggers) == n
    assert all("_tasks_" in t or t.startswith("fencekit_tasks_") for t in triggers), triggers
    assert _stale(project, "tasks") == "YF001"
    with project.connect() as conn:
        names = conn.execute("SELECT table_name FROM fencekit.protected").fetchall()
        fences = conn.execute("SELECT resource, fence FROM fencekit.fences").fetchall()
    assert names == [("tasks",)]
    assert fences == [("public.tasks", 5)]
    # Nothing left to do, and the whole history downgrades.
    again = project.autogenerate("nothing").read_text()
    assert "fence(" not in again.split("def upgrade", 1)[1].split("def downgrade", 1)[0]
    # Downgrade: the fence goes back under the old name, then the table is renamed back.
    project.alembic("downgrade", "r2")
    with project.connect() as conn:
        names = conn.execute("SELECT table_name FROM fencekit.protected").fetchall()
    assert names == [("jobs",)]
    assert len(_triggers(project, "tasks")) == n
    assert _stale(project, "tasks") == "YF001"
    project.alembic("downgrade", "-1")
    assert len(_triggers(project, "jobs")) == n
    assert _stale(project, "jobs") == "YF001"
    status = subprocess.run(
        [FENCEKIT, "status", "--dsn", project.url], capture_output=True, text=True, check=False
    )
    assert status.returncode == 0, status.stdout + status.stderr
    project.alembic("downgrade", "base")


CUSTOM = """
from sqlalchemy import Column, Integer, MetaData, Table, Text
from fencekit.declare import declare_fence

metadata = MetaData()
jobs = Table("jobs", metadata, Column("id", Integer, primary_key=True), Column("state", Text))
declare_fence(jobs, column="epoch")
"""


def test_a_custom_fence_column_is_not_a_removed_column(project: Project) -> None:
    project.write_models(CUSTOM)
    project.autogenerate("jobs")
    project.alembic("upgrade", "head")
    proc = project.alembic("revision", "--autogenerate", "-m", "again")
    assert "Detected removed column" not in proc.stderr + proc.stdout
    assert "epoch" not in proc.stderr + proc.stdout
