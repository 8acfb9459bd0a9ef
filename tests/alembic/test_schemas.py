"""Several schemas with include_schemas, removing a fence, and removing a fenced table."""

from __future__ import annotations

import re

import pytest

from fencekit import sqlgen
from fencekit.spec import FenceSpec, TableName
from tests.alembic.conftest import Project
from tests.alembic.test_roundtrip import registry

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)

BOTH = """
from sqlalchemy import Column, Integer, MetaData, Table, Text
from fencekit.declare import declare_fence

metadata = MetaData()
accounts = Table(
    "Accounts", metadata,
    Column("id", Integer, primary_key=True),
    Column("owner", Text),
    schema="Billing",
)
declare_fence(accounts, scope="key", key=["id"], resource="billing:accounts")
jobs = Table("jobs", metadata, Column("id", Integer, primary_key=True), Column("state", Text))
declare_fence(jobs, column="fence")
"""

# The fence on Accounts is removed, the table stays.
UNFENCED = BOTH.replace(
    'declare_fence(accounts, scope="key", key=["id"], resource="billing:accounts")\n', ""
)
# jobs is removed altogether, with its fence.
NO_JOBS = UNFENCED.split("jobs = Table", 1)[0]


def upgrade_block(text: str) -> str:
    return text.split("def upgrade", 1)[1].split("def downgrade", 1)[0]


def test_schemas_drops_and_table_removal(project: Project) -> None:
    with project.connect() as conn:
        conn.execute('CREATE SCHEMA "Billing"')
        # Protected by a DBA with the CLI and kept out of autogenerate by the app's own filter:
        # autogenerate must leave its fence alone.
        conn.execute("CREATE TABLE audit_log (id bigint PRIMARY KEY)")
        for statement in sqlgen.protect_statements(FenceSpec(TableName("public", "audit_log"))):
            conn.execute(statement.encode())
    start = project.pg_dump_schema()
    project.set_option("include_schemas", "true")
    env = project.root / "migrations" / "env.py"
    env.write_text(
        env.read_text().replace(
            '"include_object": fencekit_alembic.include_object,',
            '"include_object": lambda o, n, t, r, c: n != "audit_log"'
            " and fencekit_alembic.include_object(o, n, t, r, c),",
        )
    )

    project.write_models(BOTH)
    text = upgrade_block(project.autogenerate("fences").read_text())
    assert "schema='Billing'" in text or 'schema="Billing"' in text
    assert text.count("op.create_fence(") == 2
    # Nothing against fencekit's own objects (the frozen SQL in sql=(...) names them, of course).
    assert set(re.findall(r"^    op\.(\w+)\(", text, re.M)) == {"create_table", "create_fence"}
    assert "schema='fencekit'" not in text
    project.alembic("upgrade", "head")
    assert set(registry(project)) == {"Billing.Accounts", "public.jobs", "public.audit_log"}

    # Nothing to do: neither the fencekit schema nor the fence columns are proposed for drop.
    empty = project.autogenerate("nothing")
    assert "op." not in upgrade_block(empty.read_text())
    empty.unlink()
    project.alembic("check")

    project.write_models(UNFENCED)
    text = upgrade_block(project.autogenerate("unfence accounts").read_text())
    assert text.count("op.drop_fence(") == 1
    assert "'Accounts'" in text
    assert "drop_column" not in text
    project.alembic("upgrade", "head")
    assert set(registry(project)) == {"public.jobs", "public.audit_log"}

    project.write_models(NO_JOBS)
    text = upgrade_block(project.autogenerate("drop jobs").read_text())
    assert text.index("op.drop_fence(") < text.index("op.drop_table(")
    assert "drop_column" not in text
    project.alembic("upgrade", "head")
    assert set(registry(project)) == {"public.audit_log"}
    project.alembic("check")

    project.alembic("downgrade", "base")
    assert project.pg_dump_schema() == start
