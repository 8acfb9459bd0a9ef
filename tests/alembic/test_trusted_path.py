"""alembic refuses a migration connection whose search_path reaches a schema a table owner
controls: alembic's own reflection and version-table writes would run the owner's code as the
migrating superuser.

The owner, with only CREATE on the database, makes a schema named after the migrating role
(``"$user"`` puts it first on that role's default path) and plants an exact-match operator
``=(name, varchar)`` (alembic's reflection compares ``nspname = $1::VARCHAR``) or a pre-made
``alembic_version`` with a trigger. Each canary records current_user in a log table.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.alembic.conftest import Project

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)

CANARY = """
CREATE SCHEMA canary;
CREATE TABLE canary.log (who text, what text);
GRANT USAGE ON SCHEMA canary TO PUBLIC;
GRANT INSERT ON canary.log TO PUBLIC;
CREATE FUNCTION canary.hit(what text) RETURNS void LANGUAGE sql
    AS $$ INSERT INTO canary.log VALUES (current_user, what) $$;
GRANT EXECUTE ON FUNCTION canary.hit(text) TO PUBLIC;
"""


def _owner(project: Project, make_role: Callable[..., str]) -> tuple[str, str]:
    """A table owner with CREATE on the database, and the migrating superuser's name."""
    project.write_models("from sqlalchemy import MetaData\nmetadata = MetaData()\n")
    name = f"own_{secrets.token_hex(3)}"
    with project.connect() as conn:
        dbname = conn.info.dbname
        superuser = str(conn.execute("SELECT current_user").fetchone()[0])  # type: ignore[index]
    owner_dsn = make_role(name, f"CREATE ON DATABASE {dbname}")
    with psycopg.connect(owner_dsn, autocommit=True) as conn:
        conn.execute(CANARY)
    return owner_dsn, superuser


def _log(project: Project) -> list[tuple[Any, ...]]:
    with project.connect() as conn:
        return conn.execute("SELECT who, what FROM canary.log").fetchall()


def _refused(project: Project, *args: str) -> str:
    proc = project.alembic(*args, check=False)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    return proc.stderr


def test_planted_operator_in_user_schema_refused(
    project: Project, make_role: Callable[..., str]
) -> None:
    owner_dsn, superuser = _owner(project, make_role)
    project.alembic("revision", "-m", "empty")
    with psycopg.connect(owner_dsn, autocommit=True) as conn:
        schema = sql.Identifier(superuser)
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(schema))
        conn.execute(
            sql.SQL(
                "CREATE FUNCTION {}.eq(name, varchar) RETURNS boolean LANGUAGE plpgsql AS"
                " $$ BEGIN PERFORM canary.hit('operator'); RETURN $1::text = $2::text; END $$"
            ).format(schema)
        )
        conn.execute(
            sql.SQL(
                "CREATE OPERATOR {}.= (LEFTARG = name, RIGHTARG = varchar, FUNCTION = {}.eq)"
            ).format(schema, schema)
        )
    for command in (("upgrade", "head"), ("stamp", "head"), ("revision", "--autogenerate")):
        err = _refused(project, *command)
        assert f'schema "{superuser}"' in err, err
        assert "owned by role" in err
        assert "search_path" in err
    assert _log(project) == []

    # The owner's schema gone, the project migrates again.
    with project.connect() as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(superuser)))
    project.alembic("upgrade", "head")
    assert _log(project) == []


def test_planted_version_table_refused(project: Project, make_role: Callable[..., str]) -> None:
    owner_dsn, superuser = _owner(project, make_role)
    owner = str(psycopg.conninfo.conninfo_to_dict(owner_dsn)["user"])
    project.alembic("revision", "-m", "empty")
    # In a schema named after the migrating superuser (its current_schema(): alembic's default)
    with psycopg.connect(owner_dsn, autocommit=True) as conn:
        schema = sql.Identifier(superuser)
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(schema))
        conn.execute(
            sql.SQL(
                "CREATE TABLE {}.alembic_version (version_num varchar(32) PRIMARY KEY);"
                " GRANT ALL ON {}.alembic_version TO PUBLIC;"
                " GRANT USAGE ON SCHEMA {} TO PUBLIC;"
                " CREATE FUNCTION {}.trg() RETURNS trigger LANGUAGE plpgsql AS"
                " $$ BEGIN PERFORM canary.hit('version trigger'); RETURN NEW; END $$;"
                " CREATE TRIGGER t BEFORE INSERT OR UPDATE ON {}.alembic_version"
                " FOR EACH ROW EXECUTE FUNCTION {}.trg()"
            ).format(*[schema] * 6)
        )
    assert f'schema "{superuser}"' in _refused(project, "stamp", "head")
    assert _log(project) == []
    with project.connect() as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(superuser)))

    # In public, which the superuser trusts: the table is the owner's, or carries a trigger.
    with project.connect() as conn:
        conn.execute("CREATE TABLE public.alembic_version (version_num varchar(32) PRIMARY KEY)")
        conn.execute(
            sql.SQL("ALTER TABLE public.alembic_version OWNER TO {}").format(sql.Identifier(owner))
        )
    err = _refused(project, "upgrade", "head")
    assert f'"public"."alembic_version" is owned by role "{owner}"' in err, err
    with project.connect() as conn:
        conn.execute("ALTER TABLE public.alembic_version OWNER TO CURRENT_USER")
        conn.execute(
            "CREATE FUNCTION public.trg() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN PERFORM canary.hit('version trigger'); RETURN NEW; END $$;"
            " CREATE TRIGGER t BEFORE INSERT ON public.alembic_version"
            " FOR EACH ROW EXECUTE FUNCTION public.trg()"
        )
    assert "triggers" in _refused(project, "upgrade", "head")
    assert _log(project) == []
    with project.connect() as conn:
        conn.execute("DROP TRIGGER t ON public.alembic_version")
    project.alembic("upgrade", "head")


def test_create_on_public_refused(project: Project, make_role: Callable[..., str]) -> None:
    owner_dsn, _ = _owner(project, make_role)
    owner = str(psycopg.conninfo.conninfo_to_dict(owner_dsn)["user"])
    project.alembic("revision", "-m", "empty")
    with project.connect() as conn:
        conn.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(owner)))
    err = _refused(project, "upgrade", "head")
    assert f'schema "public", on which role "{owner}" has CREATE' in err, err
    with project.connect() as conn:
        conn.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
    assert 'role "PUBLIC" has CREATE' in _refused(project, "upgrade", "head")
    with project.connect() as conn:
        conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        conn.execute(
            sql.SQL("REVOKE CREATE ON SCHEMA public FROM {}").format(sql.Identifier(owner))
        )
    project.alembic("upgrade", "head")
