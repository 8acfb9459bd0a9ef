"""Fencing an existing table with rows: the table is not rewritten, its rows are kept."""

from __future__ import annotations

from tests.alembic.conftest import Project

MODELS = """
from sqlalchemy import Column, Integer, MetaData, Table, Text
from fencekit.declare import declare_fence

metadata = MetaData()
jobs = Table("jobs", metadata, Column("id", Integer, primary_key=True), Column("state", Text))
declare_fence(jobs)
"""


def relfilenode(project: Project) -> int:
    with project.connect() as conn:
        row = conn.execute("SELECT relfilenode FROM pg_class WHERE oid = 'jobs'::regclass")
        return int(row.fetchone()[0])


def test_fence_on_existing_table_does_not_rewrite_it(project: Project) -> None:
    with project.connect() as conn:
        conn.execute("CREATE TABLE jobs (id integer PRIMARY KEY, state text)")
        conn.execute("INSERT INTO jobs SELECT g, 'queued' FROM generate_series(1, 1000) g")
    before = relfilenode(project)
    project.write_models(MODELS)
    text = project.autogenerate("fence jobs").read_text()
    upgrade = text.split("def upgrade", 1)[1].split("def downgrade", 1)[0]
    assert "op.create_table" not in upgrade
    assert "op.create_fence(" in upgrade
    project.alembic("upgrade", "head")
    assert relfilenode(project) == before  # catalog-only: no table rewrite
    with project.connect() as conn:
        counts = conn.execute("SELECT count(*), count(fencekit_fence) FROM jobs").fetchone()
    assert counts == (1000, 0)
    project.alembic("downgrade", "base")
    assert relfilenode(project) == before
