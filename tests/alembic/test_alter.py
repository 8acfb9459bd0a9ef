"""Changing a declared fence autogenerates alter_fence; downgrading restores the old fence."""

from __future__ import annotations

import psycopg
import pytest

from tests.alembic.conftest import Project
from tests.alembic.test_roundtrip import registry, write

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)

BEFORE = """
from sqlalchemy import Column, Integer, MetaData, Table, Text
from fencekit.declare import declare_fence

metadata = MetaData()
billing = Table(
    "billing_summary", metadata,
    Column("account_id", Integer, primary_key=True),
    Column("region", Text, nullable=False),
    Column("summary", Text),
)
declare_fence(billing, scope="key", key=["account_id"])
"""

AFTER = BEFORE.replace(
    'declare_fence(billing, scope="key", key=["account_id"])',
    'declare_fence(billing, scope="key", key=["account_id", "region"], on_equal="reject")',
)


def test_changed_fence_autogenerates_alter_and_downgrade_restores(project: Project) -> None:
    start = project.pg_dump_schema()
    project.write_models(BEFORE)
    project.autogenerate("fence")
    project.alembic("upgrade", "head")
    before = registry(project)["public.billing_summary"]

    project.write_models(AFTER)
    text = project.autogenerate("alter fence").read_text()
    upgrade, downgrade = text.split("def upgrade", 1)[1].split("def downgrade", 1)
    # Another key is a move: one operation each way, fences carried.
    assert "op.alter_fence(" in upgrade
    assert "'key': ['account_id', 'region']" in upgrade.split("new=", 1)[1]
    assert "op.alter_fence(" in downgrade
    assert "fences carried over" in upgrade
    for direction in (upgrade, downgrade):
        sql = direction.split("sql=", 1)[1]
        assert sql.index("LOCK TABLE") < sql.index("fencekit.register_table(")
    assert "op.create_fence" not in text
    assert "op.drop_fence" not in text

    project.alembic("upgrade", "head")
    spec, _ = registry(project)["public.billing_summary"]
    assert spec["key"] == ["account_id", "region"]
    assert spec["on_equal"] == "reject"
    with project.connect() as conn:
        write(conn, 5, "INSERT INTO billing_summary VALUES (1, 'eu', 'x')")
        with pytest.raises(psycopg.Error) as err:  # on_equal=reject: a token writes once
            write(conn, 5, "UPDATE billing_summary SET summary = 'y' WHERE account_id = 1")
        assert err.value.sqlstate == "YF002"

    project.alembic("downgrade", "-1")
    assert registry(project)["public.billing_summary"] == before
    with project.connect() as conn:  # on_equal=accept again
        write(conn, 7, "UPDATE billing_summary SET summary = 'z' WHERE account_id = 1")
        write(conn, 7, "UPDATE billing_summary SET summary = 'w' WHERE account_id = 1")
    project.alembic("downgrade", "base")
    assert project.pg_dump_schema() == start


POLICY = BEFORE.replace(
    'declare_fence(billing, scope="key", key=["account_id"])',
    'declare_fence(billing, scope="key", key=["account_id"], on_missing="allow")',
)


def test_policy_change_keeps_the_fences(project: Project) -> None:
    project.write_models(BEFORE)
    project.autogenerate("fence")
    project.alembic("upgrade", "head")
    with project.connect() as conn:
        write(conn, 10, "INSERT INTO billing_summary VALUES (1, 'eu', 'x')")

    project.write_models(POLICY)
    assert "op.alter_fence(" in project.autogenerate("allow unfenced").read_text()
    project.alembic("upgrade", "head")
    with project.connect() as conn:
        conn.execute("UPDATE billing_summary SET summary = 'unfenced'")  # allowed now
        with pytest.raises(psycopg.Error) as err:  # the fence of key 1 is still 10
            write(conn, 9, "UPDATE billing_summary SET summary = 'stale'")
        assert err.value.sqlstate == "YF001"

    project.alembic("downgrade", "-1")
    with project.connect() as conn:
        with pytest.raises(psycopg.Error) as err:
            conn.execute("UPDATE billing_summary SET summary = 'unfenced'")
        assert err.value.sqlstate == "YF003"
        with pytest.raises(psycopg.Error) as err:
            write(conn, 9, "UPDATE billing_summary SET summary = 'stale'")
        assert err.value.sqlstate == "YF001"


ETCD = BEFORE.replace(
    'declare_fence(billing, scope="key", key=["account_id"])',
    'declare_fence(billing, scope="key", key=["account_id"], issuer="etcd")',
)
ZOOKEEPER = ETCD.replace('issuer="etcd"', 'issuer="zookeeper"')


def _issuer(project: Project) -> list[tuple[str | None]]:
    with project.connect() as conn:
        return conn.execute(
            "SELECT issuer FROM fencekit.resources WHERE resource = 'public.billing_summary'"
        ).fetchall()


def test_a_new_issuer_rebinds_the_resource_both_ways(project: Project) -> None:
    """The same change model as Django's MoveFence: etcd -> zookeeper is one alter_fence that
    forgets the old binding before protect binds the new issuer, and its downgrade goes back."""
    project.write_models(ETCD)
    project.autogenerate("etcd fence")
    project.alembic("upgrade", "head")
    assert _issuer(project) == [("etcd",)]
    with project.connect() as conn:
        write(conn, 10, "INSERT INTO billing_summary VALUES (1, 'eu', 'x')")

    project.write_models(ZOOKEEPER)
    assert "op.alter_fence(" in project.autogenerate("zookeeper").read_text()
    project.alembic("upgrade", "head")
    assert _issuer(project) == [("zookeeper",)]
    assert registry(project)["public.billing_summary"][0]["issuer"] == "zookeeper"
    with project.connect() as conn:  # the fences are kept
        with pytest.raises(psycopg.Error) as err:
            write(conn, 9, "UPDATE billing_summary SET summary = 'stale'")
        assert err.value.sqlstate == "YF001"

    project.alembic("downgrade", "-1")
    assert _issuer(project) == [("etcd",)]
