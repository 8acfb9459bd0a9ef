"""A table owner's code only ever runs with the owner's rights, whoever runs fencekit.

``ps_owner`` (a member of fencekit_admin, never a superuser) owns a protected table of each
scope and plants a canary where PostgreSQL runs an owner's code without being asked
(POSTGRES-CODE-PATHS.md): an IMMUTABLE function in an index expression and in an extended
statistics expression (folded whenever a read is planned), in a domain's DEFAULT, and in the
partition key of a partitioned table (folded by CREATE TRIGGER and DROP COLUMN). The canary
records ``current_user`` and ``session_user`` and tries ``ALTER ROLE ps_owner SUPERUSER``.

Then the privileged entry points run against those tables, as a superuser and as ``ps_admin``
(a member of fencekit_admin, not of ps_owner): TRUNCATE under a token (the row fence's check
reads every row's fence), ``fencekit fences``, ``fencekit move``, protect, unprotect, rename.
Afterwards the canary ran as nobody but ps_owner, and ps_owner is no superuser. What needs the
rows (a row fence's fences, a move that carries fences through the rows) or DDL whose path
reaches the owner's code is refused outside a session logged in as the owner, and runs in it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from fencekit.cli import main
from fencekit.spec import FenceSpec, Scope, TableName
from fencekit.sqlgen import protect_statements, rename_statements, unprotect_statements
from tests.security.conftest import Conn, protect

CANARY = """
CREATE TABLE public.ps_seen (who text, sess text);
GRANT INSERT ON public.ps_seen TO PUBLIC;
CREATE FUNCTION public.ps_canary(x int) RETURNS int LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO public.ps_seen VALUES (current_user, session_user);
  BEGIN
    EXECUTE 'ALTER ROLE ps_owner SUPERUSER';
  EXCEPTION WHEN insufficient_privilege THEN NULL;
  END;
  RETURN x;
END $$;
CREATE FUNCTION public.ps_imm(x int) RETURNS int IMMUTABLE LANGUAGE plpgsql AS $$
BEGIN
  RETURN public.ps_canary(x);
END $$;
CREATE DOMAIN public.ps_dom AS int DEFAULT public.ps_canary(7);
"""

# Each scope's table, with the canary in an index expression, a statistics expression and a
# domain default.
TABLES = {
    "row": FenceSpec(TableName("public", "ps_row")),
    "key": FenceSpec(TableName("public", "ps_key"), scope=Scope.KEY, key=("k",)),
    "table": FenceSpec(TableName("public", "ps_tab"), scope=Scope.TABLE),
}
PLANT = """
CREATE TABLE public.{t} (id int PRIMARY KEY, k int NOT NULL, v int NOT NULL, d public.ps_dom);
CREATE INDEX ON public.{t} ((v + public.ps_imm(0)));
CREATE STATISTICS public.{t}_st ON (v + public.ps_imm(1)) FROM public.{t};
"""
PARTITIONED = """
CREATE TABLE public.ps_part (id int, k int NOT NULL, v int NOT NULL)
  PARTITION BY RANGE ((v + public.ps_imm(2)));
CREATE TABLE public.ps_part_1 PARTITION OF public.ps_part FOR VALUES FROM (0) TO (1000);
"""
PART = FenceSpec(TableName("public", "ps_part"))


@pytest.fixture
def lab(db: Conn, dsn: str, make_role: Callable[..., str]) -> dict[str, str]:
    owner = make_role("ps_owner", "CREATE ON SCHEMA public", "fencekit_admin")
    admin = make_role("ps_admin", "fencekit_admin")
    # Protect and move create the table's functions in schema fencekit: in the owner's session
    # only once the DBA lets it create there (docs/security.md, partitioned tables)
    db.execute("GRANT CREATE ON SCHEMA fencekit TO ps_owner")
    db.execute("SET ROLE ps_owner")
    db.execute(CANARY)
    for spec in TABLES.values():
        db.execute(PLANT.format(t=spec.table.name))
    db.execute(PARTITIONED)
    db.execute("RESET ROLE")
    db.commit()
    # Protected by the DBA (a superuser), as the docs' DBA path does.
    for spec in TABLES.values():
        protect(db, spec)
    for spec in TABLES.values():
        db.execute(f"GRANT TRUNCATE ON public.{spec.table.name} TO ps_admin")
    db.commit()
    # Written by the owner: an INSERT runs the index expression and the domain default as
    # whoever inserts.
    with psycopg.connect(owner) as conn:
        conn.execute("SELECT set_config('fencekit.token', '10', true)")
        for spec in TABLES.values():
            conn.execute(
                f"INSERT INTO public.{spec.table.name} (id, k, v) VALUES (1, 1, 1), (2, 2, 2)"
            )
        conn.commit()
    db.execute("TRUNCATE public.ps_seen")
    db.commit()
    return {"dba": dsn, "admin": admin, "owner": owner}


def _seen(db: Conn) -> set[tuple[str, str]]:
    db.rollback()
    rows = db.execute("SELECT DISTINCT who, sess FROM public.ps_seen").fetchall()
    db.rollback()
    return {(str(w), str(s)) for w, s in rows}


def _assert_owner_only(db: Conn) -> None:
    db.rollback()
    row = db.execute("SELECT rolsuper FROM pg_roles WHERE rolname = 'ps_owner'").fetchone()
    db.rollback()
    assert row == (False,), "the owner's canary made ps_owner a superuser"
    strangers = {(w, s) for w, s in _seen(db) if w != "ps_owner"}
    assert not strangers, f"the owner's canary ran as {strangers}"


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


# ------------------------------------------------------------------ TRUNCATE


@pytest.mark.parametrize("runner", ["dba", "admin"])
@pytest.mark.parametrize("scope", list(TABLES))
def test_truncate_under_a_token_runs_the_owners_code_as_the_owner_only(
    db: Conn, lab: dict[str, str], runner: str, scope: str
) -> None:
    """A row fence's TRUNCATE check reads every row's fence: planning that read folds the
    canary in the index and statistics expressions. It runs as the table's owner (the check
    is a function the owner owns), never as the role that ran protect or truncates."""
    table = TABLES[scope].table.name
    with psycopg.connect(lab[runner]) as conn:
        conn.execute("SELECT set_config('fencekit.token', '10', true)")
        conn.execute(f"TRUNCATE public.{table}")
        conn.commit()
    _assert_owner_only(db)
    db.rollback()
    assert db.execute(f"SELECT count(*) FROM public.{table}").fetchone() == (0,)
    db.rollback()


@pytest.mark.parametrize("runner", ["dba", "admin"])
def test_a_stale_truncate_of_a_row_fence_is_still_refused(
    db: Conn, lab: dict[str, str], runner: str
) -> None:
    with psycopg.connect(lab[runner]) as conn:
        conn.execute("SELECT set_config('fencekit.token', '5', true)")
        with pytest.raises(psycopg.Error) as info:
            conn.execute("TRUNCATE public.ps_row")
        assert info.value.sqlstate == "YF001"
    _assert_owner_only(db)


def test_after_a_rename_truncate_judges_the_renamed_table_not_the_one_under_its_old_name(
    db: Conn, lab: dict[str, str]
) -> None:
    """The archive step: ALTER TABLE t RENAME TO t_2024; CREATE TABLE t (LIKE t_2024). The
    TRUNCATE check reads the table it fired on (by OID), never whatever holds the old name:
    the new, empty ``ps_row`` must not let a stale TRUNCATE of the archive through."""
    db.execute("ALTER TABLE public.ps_row RENAME TO ps_row_2024")
    db.execute("CREATE TABLE public.ps_row (id int, k int, v int, fencekit_fence bigint)")
    db.commit()
    with psycopg.connect(lab["dba"]) as conn:
        conn.execute("SELECT set_config('fencekit.token', '5', true)")
        with pytest.raises(psycopg.Error) as info:
            conn.execute("TRUNCATE public.ps_row_2024")
        assert info.value.sqlstate == "YF001", info.value
    db.rollback()
    assert db.execute("SELECT count(*) FROM public.ps_row_2024").fetchone() == (2,)
    db.rollback()
    _assert_owner_only(db)


def test_a_table_given_to_another_owner_after_protect_fails_closed(
    db: Conn, lab: dict[str, str], make_role: Callable[..., str], capsys: Any
) -> None:
    """The TRUNCATE check runs as the role that owned the table at protect: after ALTER TABLE
    ... OWNER TO, reading the table would run the new owner's code as the old one. Refused
    (YF000) until protect runs again."""
    make_role("ps_heir")
    db.execute("ALTER TABLE public.ps_row OWNER TO ps_heir")
    db.commit()
    with psycopg.connect(lab["dba"]) as conn:
        conn.execute("SELECT set_config('fencekit.token', '10', true)")
        with pytest.raises(psycopg.Error, match="protect the table again") as info:
            conn.execute("TRUNCATE public.ps_row")
        assert info.value.sqlstate == "YF000"
    # status says so, with the fix.
    code, out = _cli(capsys, "status", "--dsn", lab["dba"])
    assert code == 1, out
    assert "the TRUNCATE check that reads public.ps_row's fences" in out
    assert "OWNER TO ps_heir" in out


# ------------------------------------------------------------------ fences, move


@pytest.mark.parametrize("runner", ["dba", "admin"])
@pytest.mark.parametrize("scope", list(TABLES))
def test_fences_reads_no_row_outside_the_owners_session(
    db: Conn, lab: dict[str, str], runner: str, scope: str, capsys: Any
) -> None:
    table = TABLES[scope].table.name
    code, out = _cli(capsys, "fences", table, "--dsn", lab[runner])
    if scope == "row":
        assert code == 1, out
        assert "logs in as ps_owner" in out
    else:
        assert code == 0, out
    _assert_owner_only(db)


def test_fences_of_a_row_fence_in_the_owners_session(
    db: Conn, lab: dict[str, str], capsys: Any
) -> None:
    code, out = _cli(capsys, "fences", "ps_row", "--json", "--dsn", lab["owner"])
    assert code == 0, out
    assert '"max": 10' in out
    _assert_owner_only(db)


MOVES = {
    "row": ("--scope", "table"),
    "key": (),  # to a row fence
    "table": ("--key", "k"),
}


@pytest.mark.parametrize("runner", ["dba", "admin"])
@pytest.mark.parametrize("scope", list(TABLES))
def test_a_move_through_the_rows_is_refused_outside_the_owners_session(
    db: Conn, lab: dict[str, str], runner: str, scope: str, capsys: Any
) -> None:
    table = TABLES[scope].table.name
    code, out = _cli(capsys, "move", table, *MOVES[scope], "--dsn", lab[runner])
    assert code == 1, out
    assert "logged in as the owner ps_owner" in out
    _assert_owner_only(db)
    db.rollback()
    got = db.execute(
        "SELECT spec ->> 'scope' FROM fencekit.protected WHERE table_name = %s", (table,)
    ).fetchone()
    db.rollback()
    assert got == (scope,)


GIVE_GENERATED = """
DO $$DECLARE o oid; BEGIN
  FOR o IN SELECT oid FROM pg_proc WHERE pronamespace = 'fencekit'::regnamespace
            AND starts_with(proname::text, '{prefix}_') LOOP
    EXECUTE format('ALTER FUNCTION %s OWNER TO ps_owner', o::regprocedure);
  END LOOP;
  FOR o IN SELECT oid FROM pg_class WHERE relnamespace = 'fencekit'::regnamespace
            AND starts_with(relname::text, '{prefix}_') LOOP
    EXECUTE format('ALTER SEQUENCE %s OWNER TO ps_owner', o::regclass);
  END LOOP;
END$$
"""


@pytest.mark.parametrize("scope", list(TABLES))
def test_a_move_in_the_owners_session_runs_its_code_as_the_owner(
    db: Conn, lab: dict[str, str], scope: str, capsys: Any
) -> None:
    table = TABLES[scope].table.name
    # As if the owner had protected the table: it owns the generated objects the move replaces.
    db.execute(GIVE_GENERATED.replace("{prefix}", table))
    db.commit()
    code, out = _cli(capsys, "move", table, *MOVES[scope], "--dsn", lab["owner"])
    assert code == 0, out
    _assert_owner_only(db)


# ------------------------------------------------------------------ fencekit's own DDL


def _run(dsn: str, statements: list[str]) -> None:
    with psycopg.connect(dsn) as conn:
        for stmt in statements:
            conn.execute(stmt.encode())
        conn.commit()


@pytest.mark.parametrize("runner", ["dba", "admin"])
def test_protect_of_a_partitioned_table_whose_key_runs_owner_code_is_refused(
    db: Conn, lab: dict[str, str], runner: str
) -> None:
    """CREATE TRIGGER on a partitioned table folds its partition key expression: in any
    session but the owner's, protect refuses before any DDL, naming the code and the owner
    (an admin, who may not create in schema fencekit, is refused for that first)."""
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as info:
        _run(lab[runner], protect_statements(PART))
    if runner == "dba":
        assert "public.ps_imm" in str(info.value), info.value
        assert "ps_owner" in (info.value.diag.message_hint or "")
    else:
        assert "schema fencekit" in str(info.value), info.value
    _assert_owner_only(db)


def test_protect_waits_for_a_partition_being_attached_and_judges_it(
    db: Conn, lab: dict[str, str]
) -> None:
    """The owner holds, uncommitted, the attachment of a partitioned partition whose key runs
    its code, under a table the DBA then protects. Protect waits for it before its guard reads
    the tree, so the guard sees that partition's key and refuses: CREATE TRIGGER would have
    folded it as the DBA."""
    with psycopg.connect(lab["owner"], autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE public.ps_tree (id int, k int NOT NULL, v int NOT NULL)"
            " PARTITION BY RANGE (k);"
            " CREATE TABLE public.ps_tree_1 PARTITION OF public.ps_tree"
            " FOR VALUES FROM (0) TO (1000)"
        )
    result: list[BaseException | None] = []
    with psycopg.connect(lab["owner"]) as attach:
        attach.execute(
            "CREATE TABLE public.ps_sub (id int, k int NOT NULL, v int NOT NULL)"
            " PARTITION BY LIST ((k + public.ps_imm(3)));"
            " CREATE TABLE public.ps_sub_a PARTITION OF public.ps_sub DEFAULT;"
            " ALTER TABLE public.ps_tree ATTACH PARTITION public.ps_sub"
            " FOR VALUES FROM (1000) TO (2000)"
        )

        def dba() -> None:
            try:
                _run(lab["dba"], protect_statements(FenceSpec(TableName("public", "ps_tree"))))
                result.append(None)
            except BaseException as exc:  # reported below, in the test's thread
                result.append(exc)

        thread = threading.Thread(target=dba)
        thread.start()
        # The DBA's protect waits on the table; then the owner commits the attachment.
        for _ in range(300):
            row = db.execute(
                "SELECT count(*) FROM pg_locks WHERE NOT granted"
                " AND relation = 'public.ps_tree'::regclass"
            ).fetchone()
            db.rollback()
            if row is not None and row[0] > 0:
                break
            time.sleep(0.05)
        else:
            pytest.fail("protect never waited for the attachment")
        attach.commit()
    thread.join(timeout=60)
    assert result, "protect did not finish"
    assert isinstance(result[0], psycopg.errors.InsufficientPrivilege), result[0]
    assert "ps_imm" in str(result[0]), result[0]
    _assert_owner_only(db)


def test_protect_unprotect_and_rename_in_the_owners_session(db: Conn, lab: dict[str, str]) -> None:
    """In the owner's own session the same DDL runs (the partition key's code as the owner);
    unprotect and rename of it are refused elsewhere, as protect is."""
    _run(lab["owner"], protect_statements(PART))
    _assert_owner_only(db)
    for runner in ("dba", "admin"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="partition key"):
            _run(lab[runner], unprotect_statements(PART))
    db.execute("ALTER TABLE public.ps_part RENAME TO ps_part_2")
    db.commit()
    renamed = FenceSpec(TableName("public", "ps_part_2"))
    for runner in ("dba", "admin"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="partition key"):
            _run(lab[runner], rename_statements(PART, renamed.table))
    _run(lab["owner"], rename_statements(PART, renamed.table))
    _run(lab["owner"], unprotect_statements(renamed))
    _assert_owner_only(db)


def test_protect_and_unprotect_of_a_plain_table_run_no_owner_code(
    db: Conn, lab: dict[str, str]
) -> None:
    """On a plain table fencekit's DDL is catalog work: protect, re-protect and unprotect run
    in a superuser's session, the canary never runs as it, and the TRUNCATE check belongs to
    the table's owner."""
    db.execute("SET ROLE ps_owner")
    db.execute(PLANT.format(t="ps_more"))
    db.execute("RESET ROLE")
    db.commit()
    spec = FenceSpec(TableName("public", "ps_more"))
    _run(lab["dba"], protect_statements(spec))
    _run(lab["dba"], protect_statements(spec))
    _assert_owner_only(db)
    db.rollback()
    owner = db.execute(
        "SELECT p.proowner::regrole::text FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid"
        " WHERE t.tgrelid = 'public.ps_more'::regclass AND t.tgname LIKE '%\\_trunc'"
    ).fetchall()
    db.rollback()
    assert owner == [("ps_owner",)]
    _run(lab["dba"], unprotect_statements(spec))
    _assert_owner_only(db)
