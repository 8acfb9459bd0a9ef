"""``fencekit_writer_roles`` in alembic.ini: autogenerate grants fencekit_writer to each role not
yet a member (op.grant_fencekit_writer), logs what it detected as alembic does, and the
downgrade revokes it."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

from fencekit.alembic_plugin.grants import GrantWriterOp, RevokeWriterOp
from tests.alembic.conftest import Project

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)

APP = "fk_grant_app"
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
"""


def member(project: Project, role: str) -> bool:
    with project.connect() as conn:
        row = conn.execute(
            "SELECT pg_has_role(%s, 'fencekit_writer', 'MEMBER')", (role,)
        ).fetchone()
    assert row is not None
    return bool(row[0])


def test_autogenerate_grants_the_named_role_once(
    project: Project, make_role: Callable[..., str]
) -> None:
    make_role(APP)
    project.set_option("fencekit_writer_roles", APP)
    project.write_models(MODELS)
    before = set(project.versions.glob("*.py"))
    proc = project.alembic("revision", "--autogenerate", "-m", "fences")
    (path,) = set(project.versions.glob("*.py")) - before
    text = path.read_text()
    upgrade, downgrade = text.split("def upgrade", 1)[1].split("def downgrade", 1)
    assert f"op.grant_fencekit_writer('{APP}')" in upgrade
    assert upgrade.index("op.create_fence(") < upgrade.index("op.grant_fencekit_writer(")
    assert f"op.revoke_fencekit_writer('{APP}')" in downgrade
    # Logged as alembic logs the tables it detects.
    assert "Detected create_fence on 'public.billing_summary'" in proc.stderr
    assert f"Detected grant_fencekit_writer to role '{APP}'" in proc.stderr

    assert not member(project, APP)
    project.alembic("upgrade", "head")
    assert member(project, APP)
    # A member already: nothing more to do.
    empty = project.autogenerate("nothing")
    assert "grant_fencekit_writer" not in empty.read_text()
    empty.unlink()
    project.alembic("downgrade", "base")
    assert not member(project, APP)


def test_the_operations_reverse_each_other_and_refuse_public() -> None:
    grant = GrantWriterOp(APP)
    assert isinstance(grant.reverse(), RevokeWriterOp)
    assert grant.reverse().reverse().to_diff_tuple() == ("grant_fencekit_writer", APP)
    with pytest.raises(ValueError, match="login role"):
        GrantWriterOp("PUBLIC")


def test_a_role_name_that_needs_quotes_is_quoted(
    project: Project, make_role: Callable[..., str]
) -> None:
    role = "Fk Grant-App"
    make_role(role)
    project.set_option("fencekit_writer_roles", "")
    project.write_models(MODELS)
    path = project.autogenerate("fences")
    text = path.read_text()
    body = text.split("def upgrade() -> None:\n", 1)[1].split("\n\n\ndef downgrade", 1)[0]
    # Written by hand, after the fence operations (which install the core and its role).
    path.write_text(text.replace(body, body + f"\n    op.grant_fencekit_writer({role!r})", 1))
    project.alembic("upgrade", "head")
    assert member(project, role)
    with psycopg.connect(project.dsn, autocommit=True) as conn:
        conn.execute(f'REVOKE fencekit_writer FROM "{role}"')
