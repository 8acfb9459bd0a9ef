"""Several schemas with include_schemas, removing a fence, and removing a fenced table."""

from __future__ import annotations

from tests.alembic.conftest import Project
from tests.alembic.test_roundtrip import registry

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
    start = project.pg_dump_schema()
    project.set_option("include_schemas", "true")

    project.write_models(BOTH)
    text = upgrade_block(project.autogenerate("fences").read_text())
    assert "schema='Billing'" in text or 'schema="Billing"' in text
    assert text.count("op.create_fence(") == 2
    assert "fencekit" not in text.replace("op.create_fence", "").replace("fencekit_fence", "")
    project.alembic("upgrade", "head")
    assert set(registry(project)) == {"Billing.Accounts", "public.jobs"}

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
    assert set(registry(project)) == {"public.jobs"}

    project.write_models(NO_JOBS)
    text = upgrade_block(project.autogenerate("drop jobs").read_text())
    assert text.index("op.drop_fence(") < text.index("op.drop_table(")
    assert "drop_column" not in text
    project.alembic("upgrade", "head")
    assert registry(project) == {}
    project.alembic("check")

    project.alembic("downgrade", "base")
    assert project.pg_dump_schema() == start
