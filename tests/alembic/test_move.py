"""A declared fence whose scope, key, resource or fence column changes autogenerates one
``op.alter_fence`` (frozen SQL, fences carried), never a drop and a create; its downgrade moves
the table back, fences carried again."""

from __future__ import annotations

import psycopg
import pytest

from tests.alembic.conftest import Project
from tests.alembic.test_roundtrip import registry, write

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)

ROW = """
from sqlalchemy import Column, Integer, MetaData, Table, Text
from fencekit.declare import declare_fence

metadata = MetaData()
billing = Table(
    "billing_summary", metadata,
    Column("id", Integer, primary_key=True),
    Column("account_id", Integer, nullable=False),
    Column("summary", Text),
)
declare_fence(billing)
"""

KEY = ROW.replace(
    "declare_fence(billing)", 'declare_fence(billing, scope="key", key=["account_id"])'
)


def _stale(conn: psycopg.Connection, token: int, sql: str) -> str:
    with pytest.raises(psycopg.Error) as err:
        write(conn, token, sql)
    return str(err.value.sqlstate)


def test_structural_change_autogenerates_one_move(project: Project) -> None:
    project.write_models(ROW)
    project.autogenerate("fence")
    project.alembic("upgrade", "head")
    with project.connect() as conn:
        write(conn, 10, "INSERT INTO billing_summary VALUES (1, 7, 'a')")
        write(conn, 20, "INSERT INTO billing_summary VALUES (2, 7, 'b')")

    project.write_models(KEY)
    text = project.autogenerate("row fence to key fence").read_text()
    upgrade, downgrade = text.split("def upgrade", 1)[1].split("def downgrade", 1)
    for direction in (upgrade, downgrade):
        assert direction.count("op.alter_fence(") == 1
        assert "sql=(" in direction  # frozen
        assert "DELETE FROM fencekit.fences" not in direction.split("IF NOT EXISTS", 1)[0]
    for absent in ("op.create_fence", "op.drop_fence", "drop_column"):
        assert absent not in text
    assert "'scope': 'key'" in upgrade.split("new=", 1)[1]

    project.alembic("upgrade", "head")
    spec, _ = registry(project)["public.billing_summary"]
    assert spec["scope"] == "key"
    with project.connect() as conn:
        # Row 2 accepted 20: key 7 now rejects anything lower, for every row of the key.
        assert _stale(conn, 19, "UPDATE billing_summary SET summary = 'x' WHERE id = 1") == "YF001"
        write(conn, 20, "UPDATE billing_summary SET summary = 'holder' WHERE id = 1")
        write(conn, 25, "UPDATE billing_summary SET summary = 'newer' WHERE id = 2")

    project.alembic("downgrade", "-1")  # back to a row fence: each row gets its key's fence
    spec, _ = registry(project)["public.billing_summary"]
    assert spec["scope"] == "row"
    with project.connect() as conn:
        fences = dict(conn.execute("SELECT id, fencekit_fence FROM billing_summary").fetchall())
        assert fences == {1: 25, 2: 25}
        assert _stale(conn, 24, "UPDATE billing_summary SET summary = 'x' WHERE id = 1") == "YF001"
    project.alembic("downgrade", "base")
