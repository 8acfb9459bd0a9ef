"""A database without fencekit: autogenerate installs the core before the first fence."""

from __future__ import annotations

import psycopg
import pytest

from fencekit import sqlgen
from tests.alembic.conftest import Project
from tests.alembic.test_roundtrip import MODELS, write

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)


def test_core_install_first_and_env_without_filters(raw_project: Project) -> None:
    project = raw_project
    start = project.pg_dump_schema()
    project.write_models(MODELS)
    text = project.autogenerate("fences").read_text()
    upgrade, downgrade = text.split("def upgrade", 1)[1].split("def downgrade", 1)
    assert f"op.install_fencekit(\n        core_version={sqlgen.CORE_VERSION}," in upgrade
    assert upgrade.index("op.install_fencekit(") < upgrade.index("op.create_table(")
    assert downgrade.rindex("op.uninstall_fencekit(") > downgrade.rindex("op.drop_table(")
    project.alembic("upgrade", "head")
    with project.connect() as conn:
        write(conn, 34, "INSERT INTO jobs VALUES (1, 'new')")
        with pytest.raises(psycopg.Error) as err:
            write(conn, 33, "UPDATE jobs SET state = 'stale'")
        assert err.value.sqlstate == "YF001"

    # An env.py without fencekit's filters, comparing every schema: the comparator still keeps
    # alembic away from the fencekit schema and the fence columns.
    env = project.root / "migrations" / "env.py"
    env.write_text(
        env.read_text()
        .replace('"include_name": fencekit_alembic.include_name,', "")
        .replace('"include_object": fencekit_alembic.include_object,', "")
    )
    project.set_option("include_schemas", "true")
    empty = project.autogenerate("nothing")
    assert "op." not in empty.read_text().split("def upgrade", 1)[1].split("def downgrade")[0]
    empty.unlink()

    project.alembic("downgrade", "base")
    assert project.pg_dump_schema() == start
