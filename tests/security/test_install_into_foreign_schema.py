"""The core install runs only into a schema ``fencekit`` that fencekit's side owns.

A table owner with CREATE on the database can make schema ``fencekit`` (and ``fencekit.meta``,
with a trigger on it) before a superuser first installs, or again after ``fencekit uninstall``
drops the schema. The install then wrote ``fencekit.meta`` as the superuser and fired the
owner's trigger with the superuser's rights; and as the schema's owner it could later replace
a helper that the core's definer functions call. The install now refuses, naming every object
another role made, and changes nothing; a clean install and a re-install still work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from fencekit.cli import main
from fencekit.sqlgen import render_install
from tests.core.helpers import USAGE

Conn = psycopg.Connection[Any]

CANARY = """
CREATE SCHEMA own;
CREATE FUNCTION own.canary() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE pg_catalog.format('ALTER ROLE %I SUPERUSER', session_user);
  RETURN NEW;
END $$;
"""


def _install(conn: Conn) -> None:
    """The install script as a DBA runs it (its own BEGIN ... COMMIT)."""
    conn.autocommit = True
    try:
        conn.execute(render_install().encode())  # type: ignore[call-overload]
    except psycopg.Error:
        conn.execute("ROLLBACK")  # the script's own transaction, left failed
        raise
    finally:
        conn.autocommit = False


def _superuser(conn: Conn, role: str) -> bool:
    row = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
    assert row is not None
    return bool(row[0])


@pytest.fixture
def owner(raw_db: Conn, make_role: Callable[..., str]) -> tuple[str, str]:
    """A table owner that may create schemas in the database, and its DSN."""
    dsn = make_role("fk_schema_squatter")
    raw_db.execute(f"GRANT CREATE ON DATABASE {raw_db.info.dbname} TO fk_schema_squatter")
    raw_db.commit()
    return "fk_schema_squatter", dsn


def test_install_refuses_a_schema_another_role_made(raw_db: Conn, owner: tuple[str, str]) -> None:
    role, dsn = owner
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(CANARY)
        conn.execute("CREATE SCHEMA fencekit")
        conn.execute("CREATE TABLE fencekit.meta (key text PRIMARY KEY, value text NOT NULL)")
        conn.execute(
            "CREATE TRIGGER c BEFORE INSERT OR UPDATE ON fencekit.meta "
            "FOR EACH ROW EXECUTE FUNCTION own.canary()"
        )
    with pytest.raises(psycopg.Error) as info:
        _install(raw_db)
    raw_db.rollback()
    assert info.value.sqlstate == USAGE
    message = str(info.value)
    assert "refusing to install into, or read, schema fencekit" in message
    assert f"schema fencekit (owner {role})" in message
    assert "trigger c on fencekit.meta" in message
    assert not _superuser(raw_db, role)
    # Nothing was installed: the squatter's table is all there is.
    assert raw_db.execute(
        "SELECT count(*) FROM pg_proc WHERE pronamespace = 'fencekit'::regnamespace"
    ).fetchone() == (0,)


def test_handing_the_objects_over_is_not_enough_while_a_trigger_stays(
    raw_db: Conn, owner: tuple[str, str]
) -> None:
    """ALTER ... OWNER TO gives the schema and table to the installer, but the owner's trigger
    stays on fencekit.meta: the install still refuses, naming it."""
    role, dsn = owner
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(CANARY)
        conn.execute("CREATE SCHEMA fencekit")
        conn.execute("CREATE TABLE fencekit.meta (key text PRIMARY KEY, value text NOT NULL)")
        conn.execute(
            "CREATE TRIGGER c BEFORE INSERT OR UPDATE ON fencekit.meta "
            "FOR EACH ROW EXECUTE FUNCTION own.canary()"
        )
    raw_db.execute("ALTER SCHEMA fencekit OWNER TO CURRENT_USER")
    raw_db.execute("ALTER TABLE fencekit.meta OWNER TO CURRENT_USER")
    raw_db.commit()
    with pytest.raises(psycopg.Error) as info:
        _install(raw_db)
    raw_db.rollback()
    assert info.value.sqlstate == USAGE
    assert "trigger c on fencekit.meta" in str(info.value)
    assert not _superuser(raw_db, role)


def test_a_function_planted_in_an_installed_schema_is_refused(
    raw_db: Conn, owner: tuple[str, str]
) -> None:
    """After a clean install, a role given CREATE on schema fencekit plants a function there:
    the next install (an upgrade) refuses rather than run beside it."""
    role, dsn = owner
    _install(raw_db)
    raw_db.execute(f"GRANT CREATE ON SCHEMA fencekit TO {role}")
    raw_db.commit()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION fencekit.helper() RETURNS int LANGUAGE sql AS 'SELECT 1'")
    with pytest.raises(psycopg.Error) as info:
        _install(raw_db)
    raw_db.rollback()
    assert info.value.sqlstate == USAGE
    assert f"function fencekit.helper() (owner {role})" in str(info.value)


def test_a_trigger_under_fencekit_s_own_trigger_name_is_refused(
    raw_db: Conn, owner: tuple[str, str]
) -> None:
    """fencekit's attribution tables carry triggers of its own (each calling fencekit's
    function of its name). The same name on the same table, calling another role's function,
    is still refused."""
    role, dsn = owner
    _install(raw_db)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(CANARY)
    raw_db.execute("DROP TRIGGER unfenced_log_commit_marker ON fencekit.unfenced_log")
    raw_db.execute(
        "CREATE TRIGGER unfenced_log_commit_marker BEFORE INSERT ON fencekit.unfenced_log"
        " FOR EACH ROW EXECUTE FUNCTION own.canary()"
    )
    raw_db.commit()
    with pytest.raises(psycopg.Error) as info:
        _install(raw_db)
    raw_db.rollback()
    assert info.value.sqlstate == USAGE
    assert "trigger unfenced_log_commit_marker on fencekit.unfenced_log" in str(info.value)
    assert not _superuser(raw_db, role)


def test_a_clean_install_and_a_reinstall_still_work(raw_db: Conn) -> None:
    _install(raw_db)
    _install(raw_db)
    assert raw_db.execute("SELECT value FROM fencekit.meta WHERE key = 'owner'").fetchone() == (
        raw_db.info.user,
    )


def test_code_left_attached_after_handing_the_objects_over_is_refused(
    raw_db: Conn, owner: tuple[str, str]
) -> None:
    """No trigger, rule or policy: a column default, a CHECK and an index expression on
    fencekit.meta call the owner's function. Handed to the installer, they would still run it
    with the installer's rights when the install writes fencekit.meta: refused, naming them."""
    role, dsn = owner
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(CANARY)
        conn.execute(
            "CREATE FUNCTION own.grab() RETURNS void LANGUAGE plpgsql AS $$ BEGIN "
            "EXECUTE pg_catalog.format('ALTER ROLE %I SUPERUSER', session_user); "
            "EXCEPTION WHEN insufficient_privilege THEN NULL; END $$"
        )
        conn.execute(
            "CREATE FUNCTION own.imm(x int) RETURNS int IMMUTABLE LANGUAGE plpgsql AS $$ "
            "BEGIN PERFORM own.grab(); RETURN x; END $$"
        )
        conn.execute("CREATE SCHEMA fencekit")
        conn.execute(
            "CREATE TABLE fencekit.meta (key text PRIMARY KEY, value text NOT NULL, "
            "n int DEFAULT own.imm(1) CHECK (own.imm(n) IS NOT NULL))"
        )
        conn.execute("CREATE INDEX ON fencekit.meta ((length(key) + own.imm(0)))")
    raw_db.execute("ALTER SCHEMA fencekit OWNER TO CURRENT_USER")
    raw_db.execute("ALTER TABLE fencekit.meta OWNER TO CURRENT_USER")
    raw_db.commit()
    with pytest.raises(psycopg.Error) as info:
        _install(raw_db)
    raw_db.rollback()
    assert info.value.sqlstate == USAGE
    message = str(info.value)
    assert "calls function own.imm(integer)" in message, message
    assert "default value for column n of table fencekit.meta" in message, message
    assert not _superuser(raw_db, role)


def test_an_inheritance_child_left_on_a_handed_over_table_is_refused_by_install_and_status(
    raw_db: Conn, owner: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The owner made fencekit.meta and a child of it, in a schema of its own, whose CHECK
    calls its code: planning a read of fencekit.meta with a condition folds that CHECK
    (constraint exclusion). After the table was handed over, the install and every command
    (here status, which reads fencekit.meta first) refuse before reading it."""
    role, dsn = owner
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(CANARY)
        conn.execute(
            "CREATE FUNCTION own.grab() RETURNS void LANGUAGE plpgsql AS $$ BEGIN "
            "EXECUTE pg_catalog.format('ALTER ROLE %I SUPERUSER', session_user); "
            "EXCEPTION WHEN insufficient_privilege THEN NULL; END $$"
        )
        conn.execute(
            "CREATE FUNCTION own.imm(x int) RETURNS int IMMUTABLE LANGUAGE plpgsql AS $$ "
            "BEGIN PERFORM own.grab(); RETURN x; END $$"
        )
        conn.execute("CREATE SCHEMA fencekit")
        conn.execute("CREATE TABLE fencekit.meta (key text PRIMARY KEY, value text NOT NULL)")
        conn.execute("INSERT INTO fencekit.meta VALUES ('core_version', '1')")
        conn.execute(
            "CREATE TABLE own.meta_child (CHECK (length(key) > own.imm(0) - 1000)) "
            "INHERITS (fencekit.meta)"
        )
    raw_db.execute("ALTER SCHEMA fencekit OWNER TO CURRENT_USER")
    raw_db.execute("ALTER TABLE fencekit.meta OWNER TO CURRENT_USER")
    raw_db.commit()
    with pytest.raises(psycopg.Error) as info:
        _install(raw_db)
    raw_db.rollback()
    assert info.value.sqlstate == USAGE
    assert "own.meta_child inherits from fencekit.meta" in str(info.value)
    capsys.readouterr()
    code = main(["status", "--dsn", _dsn_of(raw_db)])
    err = capsys.readouterr().err
    assert code == 1
    assert "refusing to install into, or read, schema fencekit" in err, err
    assert "own.meta_child inherits from fencekit.meta" in err, err
    assert not _superuser(raw_db, role)


def _dsn_of(conn: Conn) -> str:
    info = conn.info
    return f"host={info.host} port={info.port} dbname={info.dbname} user={info.user}"
