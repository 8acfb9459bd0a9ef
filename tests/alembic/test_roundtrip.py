"""End to end: declare fences -> autogenerate -> upgrade -> stale write rejected -> downgrade."""

from __future__ import annotations

import psycopg
import pytest

from tests.alembic.conftest import Project

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)

MODELS = """
from sqlalchemy import Column, Integer, MetaData, Table, Text
from fencekit.declare import declare_fence

metadata = MetaData()
billing = Table(
    "billing_summary", metadata,
    Column("account_id", Integer, primary_key=True),
    Column("summary", Text),
)
declare_fence(billing, scope="key", key=["account_id"])
jobs = Table("jobs", metadata, Column("id", Integer, primary_key=True), Column("state", Text))
declare_fence(jobs)
"""


def write(conn: psycopg.Connection, token: int, sql: str, *params: object) -> None:
    with conn.transaction():
        conn.execute("SELECT set_config('fencekit.token', %s, true)", (str(token),))
        conn.execute(sql, params)


@pytest.mark.all_servers
def test_autogenerate_upgrade_reject_downgrade(project: Project) -> None:
    start = project.pg_dump_schema()
    project.write_models(MODELS)
    text = project.autogenerate("fences").read_text()
    assert "import fencekit.alembic_plugin" in text
    assert "info=" not in text  # the declaration renders as create_fence, not Table.info
    assert "op.create_fence(" in text
    assert "sql=(" in text  # the SQL it runs is frozen into the file (test_frozen_sql.py)
    project.alembic("upgrade", "head")
    with project.connect() as conn:
        write(conn, 34, "INSERT INTO billing_summary VALUES (42, 'B')")
        with pytest.raises(psycopg.Error) as err:
            write(conn, 33, "UPDATE billing_summary SET summary = 'A' WHERE account_id = 42")
        assert err.value.sqlstate == "YF001"

    # Right after the upgrade there is nothing to do, and `alembic check` agrees.
    empty = project.autogenerate("nothing")
    upgrade = empty.read_text().split("def upgrade", 1)[1].split("def downgrade", 1)[0]
    assert "op." not in upgrade  # no fence, no drop of the fence column or fencekit's tables
    empty.unlink()
    project.alembic("check")

    project.alembic("downgrade", "base")
    assert project.pg_dump_schema() == start


def registry(project: Project) -> dict[str, tuple[dict, int]]:
    with project.connect() as conn:
        rows = conn.execute(
            "SELECT schema_name || '.' || table_name, spec, template_version "
            "FROM fencekit.protected"
        ).fetchall()
    return {name: (spec, tv) for name, spec, tv in rows}
