"""Offline mode: ``alembic upgrade --sql`` prints SQL that parses and, run by psql, gives the
same schema as running the migration online."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pglast
import psycopg
import pytest
from psycopg import sql

from tests.alembic.conftest import Project
from tests.alembic.test_roundtrip import MODELS

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)


@pytest.fixture
def spare_dsn(raw_project: Project, target_server) -> Iterator[str]:
    """A second empty database on the same server, for the psql run."""
    name = f"fk_offline_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(target_server.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield target_server.dsn_for(name)
    finally:
        with psycopg.connect(target_server.dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def test_offline_sql_parses_and_matches_online(raw_project: Project, spare_dsn: str) -> None:
    project = raw_project
    project.write_models(MODELS)
    text = project.autogenerate("fences").read_text()
    upgrade = text.split("def upgrade", 1)[1].split("def downgrade", 1)[0]
    # The core comes first, the fences after the tables they protect.
    assert upgrade.index("op.install_fencekit(") < upgrade.index("op.create_table(")
    assert upgrade.rindex("op.create_table(") < upgrade.index("op.create_fence(")

    script = project.alembic("upgrade", "head", "--sql").stdout
    statements = pglast.parse_sql(script)
    assert len(statements) > 10
    assert "CREATE TRIGGER" in script
    assert "SET lock_timeout = '5s';" in script
    assert script.count("CREATE OR REPLACE FUNCTION fencekit.") >= 2
    path = project.root / "upgrade.sql"
    path.write_text(script)

    project.alembic("upgrade", "head")
    online = project.pg_dump_schema()
    offline = Project(
        root=project.root,
        dsn=spare_dsn,
        url=project.url,
        server_version_num=project.server_version_num,
    )
    offline.psql_file(path)
    assert offline.pg_dump_schema() == online
