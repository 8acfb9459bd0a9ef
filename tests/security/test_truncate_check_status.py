"""What ``fencekit status`` says about a row fence's TRUNCATE check, the generated function
that belongs to its table's owner by design (it reads the table, so the owner's code it runs
runs with the owner's rights only).

- After the owner renames the table, status says to run ``fencekit rename``, never to give
  the check to the installer (which would refuse every TRUNCATE); following it works.
- Whatever the owner changes of the check's definition (security, schema, body, settings,
  volatility, strictness, cost, owner, EXECUTE grants) is a status finding with a message that
  names the change, exit 1; following the fix restores the generated definition.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

from fencekit.cli import main
from fencekit.spec import FenceSpec, Scope, TableName
from tests.security.conftest import Conn, protect

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)

#: A row fence on a plain and on a partitioned table (the TRUNCATE check exists only for row
#: fences), and the other scopes for a change that every generated definer function can take.
TABLES = {
    "row": FenceSpec(TableName("public", "tc_row")),
    "partitioned": FenceSpec(TableName("public", "tc_part")),
    "key": FenceSpec(TableName("public", "tc_key"), scope=Scope.KEY, key=("k",)),
    "table": FenceSpec(TableName("public", "tc_tab"), scope=Scope.TABLE),
}
ROW_FENCES = ["row", "partitioned"]
PLANT = """
CREATE TABLE public.tc_row (id int PRIMARY KEY, k int NOT NULL);
CREATE TABLE public.tc_part (id int NOT NULL, k int NOT NULL) PARTITION BY RANGE (id);
CREATE TABLE public.tc_part_1 PARTITION OF public.tc_part FOR VALUES FROM (0) TO (1000);
CREATE TABLE public.tc_key (id int PRIMARY KEY, k int NOT NULL);
CREATE TABLE public.tc_tab (id int PRIMARY KEY, k int NOT NULL);
CREATE SCHEMA tc_elsewhere;
"""


@pytest.fixture
def lab(
    request: pytest.FixtureRequest, db: Conn, dsn: str, make_role: Callable[..., str]
) -> dict[str, str]:
    """Tables of ``tc_owner`` (no admin, no superuser); the test's scope's table protected by
    the DBA, with one row."""
    owner = make_role("tc_owner", "CREATE ON SCHEMA public", "CREATE ON DATABASE " + db.info.dbname)
    admin = make_role("tc_admin", "fencekit_admin")
    with psycopg.connect(owner, autocommit=True) as conn:
        conn.execute(PLANT)
    spec = TABLES[request.node.callspec.params["scope"]]
    protect(db, spec)
    db.commit()
    with psycopg.connect(owner) as conn:
        conn.execute("SELECT set_config('fencekit.token', '10', true)")
        conn.execute(f"INSERT INTO {spec.table.sql} VALUES (1, 1)")
        conn.commit()
    return {"dba": dsn, "admin": admin, "owner": owner}


def _status(capsys: pytest.CaptureFixture[str], dsn: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["status", "--dsn", dsn])
    out = capsys.readouterr()
    return code, out.out + out.err


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> None:
    capsys.readouterr()
    code = main(list(argv))
    out = capsys.readouterr()
    assert code == 0, out.out + out.err


def _check_of(db: Conn, table: str, suffix: str = "trunc") -> str:
    """The generated function its fencekit_*_<suffix> trigger calls, as regprocedure text."""
    db.rollback()
    row = db.execute(
        "SELECT t.tgfoid::regprocedure::text FROM pg_trigger t WHERE t.tgrelid = %s::regclass "
        "AND t.tgname LIKE %s AND t.tgparentid = 0",
        (table, f"fencekit\\_%\\_{suffix}"),
    ).fetchone()
    db.rollback()
    assert row is not None
    return str(row[0])


def _truncate(dsn: str, table: str, token: int) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT set_config('fencekit.token', %s, true)", (str(token),))
        conn.execute(f"TRUNCATE {table}")
        conn.commit()


# ------------------------------------------------------------------ after a rename


@pytest.mark.parametrize("archive", [False, True], ids=["renamed", "archived"])
@pytest.mark.parametrize("runner", ["dba", "admin"])
@pytest.mark.parametrize("scope", ROW_FENCES)
def test_after_a_rename_status_says_rename_never_give_the_check_away(
    db: Conn,
    lab: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    runner: str,
    scope: str,
    archive: bool,
) -> None:
    spec = TABLES[scope]
    old, new = spec.table.sql, f"{spec.table.sql}_2024"
    check = _check_of(db, old)
    with psycopg.connect(lab["owner"], autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {old} RENAME TO {spec.table.name}_2024")
        if archive:  # the archive step: a new table under the old name
            conn.execute(f"CREATE TABLE {old} (LIKE {new})")
    code, out = _status(capsys, lab[runner])
    assert code == 1, out
    assert f"fencekit rename {old} {new}" in out, out
    assert check not in out, f"status gave advice about the owner's TRUNCATE check:\n{out}"
    assert "OWNER TO" not in out, out
    # Following the advice: rename, and the TRUNCATE check is still the owner's and works.
    _cli(capsys, "rename", old, new, "--dsn", lab["dba"])
    code, out = _status(capsys, lab[runner])
    assert code == 0, out
    with pytest.raises(psycopg.Error) as info:
        _truncate(lab["owner"], new, 5)
    assert info.value.sqlstate == "YF001", info.value
    _truncate(lab["owner"], new, 10)
    db.rollback()
    assert db.execute(f"SELECT count(*) FROM {new}").fetchone() == (0,)
    db.rollback()


@pytest.mark.parametrize("scope", ROW_FENCES)
def test_the_installers_copy_of_the_advice_would_have_broken_truncate(
    db: Conn, lab: dict[str, str], scope: str
) -> None:
    """Why the advice must never be given: the check, given to the installer, refuses every
    TRUNCATE under a token (reading the table as the installer would run the owner's code
    with the installer's rights)."""
    spec = TABLES[scope]
    check = _check_of(db, spec.table.sql)
    db.execute(f"ALTER FUNCTION {check} OWNER TO CURRENT_USER")
    db.commit()
    with pytest.raises(psycopg.Error) as info:
        _truncate(lab["owner"], spec.table.sql, 10)
    assert info.value.sqlstate == "YF000", info.value


# ------------------------------------------------------------------ a changed definition

#: change -> (SQL run as the owner, or as the DBA where the owner may not; {f}: the check,
#: {s}: its name without arguments), what status says about it.
CHANGES: dict[str, tuple[str, str, str]] = {
    "security invoker": (
        "owner",
        "ALTER FUNCTION {f} SECURITY INVOKER",
        "SECURITY INVOKER, not SECURITY DEFINER",
    ),
    "search_path": (
        "owner",
        "ALTER FUNCTION {f} SET search_path = public",
        "SET row_security=off, search_path=public, not SET",
    ),
    "setting reset": ("owner", "ALTER FUNCTION {f} RESET ALL", "SET nothing, not SET"),
    "extra setting": ("owner", "ALTER FUNCTION {f} SET work_mem = '1MB'", "work_mem=1MB"),
    "volatility": ("owner", "ALTER FUNCTION {f} IMMUTABLE", "IMMUTABLE, not VOLATILE"),
    "strict": ("owner", "ALTER FUNCTION {f} STRICT", "STRICT, not CALLED ON NULL INPUT"),
    "parallel": ("owner", "ALTER FUNCTION {f} PARALLEL SAFE", "PARALLEL SAFE, not PARALLEL UNSAFE"),
    "cost": ("owner", "ALTER FUNCTION {f} COST 1", "COST 1, not COST 100"),
    "leakproof": ("dba", "ALTER FUNCTION {f} LEAKPROOF", "LEAKPROOF, not NOT LEAKPROOF"),
    "body": (
        "dba",
        "DO $$ BEGIN EXECUTE pg_catalog.format("
        "'CREATE OR REPLACE FUNCTION %s RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER "
        "SET search_path = pg_catalog, pg_temp SET row_security = off AS ''BEGIN RETURN NULL; "
        "END''', '{f}'); END $$",
        "the body of function",
    ),
    "grant": ("owner", "GRANT EXECUTE ON FUNCTION {f} TO PUBLIC", "is granted to PUBLIC"),
    "schema": (
        "owner",
        "ALTER FUNCTION {f} SET SCHEMA tc_elsewhere",
        "is missing: moved to tc_elsewhere.",
    ),
    "owner": (
        "dba",
        "ALTER FUNCTION {f} OWNER TO tc_admin",
        "belongs to tc_admin, not to the table's owner tc_owner",
    ),
}


def _follow_fixes(db: Conn, lab: dict[str, str], out: str) -> None:
    """Run every fix status printed: SQL as the DBA, fencekit commands as the DBA."""
    for line in out.splitlines():
        line = line.strip()
        if not line.startswith("fix: "):
            continue
        fix = line.removeprefix("fix: ")
        if fix.startswith("review the change, then fencekit protect"):
            fix = fix.removeprefix("review the change, then ")
        elif fix.startswith("review "):
            continue  # the moved function, seen as foreign code: gone with its trigger
        for part in fix.split("; then "):
            part = part.split(" (")[0].split(", or ")[0].removesuffix(" (as a superuser)")
            if part.startswith("fencekit "):
                argv = part.removeprefix("fencekit ").replace("--dsn DSN", "").split()
                assert main([*argv, "--dsn", lab["dba"]]) == 0, part
            else:
                db.execute(part)
                db.commit()


@pytest.mark.parametrize("change", list(CHANGES))
@pytest.mark.parametrize("scope", ROW_FENCES)
def test_every_change_of_the_truncate_checks_definition_is_reported(
    db: Conn, lab: dict[str, str], capsys: pytest.CaptureFixture[str], scope: str, change: str
) -> None:
    spec = TABLES[scope]
    check = _check_of(db, spec.table.sql)
    who, sql, says = CHANGES[change]
    with psycopg.connect(lab[who], autocommit=True) as conn:
        conn.execute(sql.format(f=check))
    code, out = _status(capsys, lab["dba"])
    assert code == 1, out
    assert says in out, out
    assert "OWNER TO tc_admin" not in out, out
    assert "OWNER TO postgres" not in out, out
    _follow_fixes(db, lab, out)
    code, out = _status(capsys, lab["dba"])
    assert code == 0, out
    with pytest.raises(psycopg.Error) as info:
        _truncate(lab["owner"], spec.table.sql, 5)
    assert info.value.sqlstate == "YF001", info.value
    _truncate(lab["owner"], spec.table.sql, 10)


@pytest.mark.parametrize("scope", ["key", "table"])
def test_a_changed_definition_of_any_generated_function_is_reported(
    db: Conn, lab: dict[str, str], capsys: pytest.CaptureFixture[str], scope: str
) -> None:
    """Key and table fences' checks belong to the role that ran protect; a change of their
    definition by it (or a superuser) is reported the same way."""
    spec = TABLES[scope]
    check = _check_of(db, spec.table.sql, "trunc")
    db.execute(f"ALTER FUNCTION {check} SECURITY INVOKER SET search_path = public")
    db.commit()
    code, out = _status(capsys, lab["admin"])
    assert code == 1, out
    assert "SECURITY INVOKER, not SECURITY DEFINER" in out, out
    assert "search_path=public" in out, out
    _follow_fixes(db, lab, out)
    code, out = _status(capsys, lab["admin"])
    assert code == 0, out
