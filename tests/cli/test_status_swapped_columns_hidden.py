"""A swapped or renamed-away fence or key column that something else hides: a rename of the
table after the swap, a fence column renamed away with none added under its name, and an
inheritance child's swap whose INSERT trigger (one witness of the column fencekit bound) the
owner dropped. Status keeps reporting the column, and the commands its fixes name (rename,
re-protect) refuse to bind the protection to a new column: they never end with status clean
and the fence read from another column than the one that holds the fences."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from .conftest import Cli
from .test_status_swapped_columns import _drift, _sql
from .test_unprotect_exact import _psql


def _write(dsn: str, token: int, statement: str) -> None:
    """One fenced write with ``token``: raises what fencekit raises."""
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT set_config('fencekit.token', %s, true)", (str(token),))
        conn.execute(statement)


def _kinds(drift: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(d["kind"], d["object"]) for d in drift]


def _rename_refused(cli: Cli, dsn: str, tmp_path: Path, old: str, new: str, *opts: str) -> None:
    """``fencekit rename`` and the script ``fencekit sql rename`` prints both refuse, changing
    nothing."""
    r = cli("rename", old, new, "--dsn", dsn)
    assert r.code != 0
    assert "is not the column it was protected with" in r.err, r.err
    done = _psql(dsn, cli("sql", "rename", old, new, *opts).out, tmp_path)
    assert done.returncode != 0
    assert "is not the column it was protected with" in done.stderr, done.stderr
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT table_name FROM fencekit.protected WHERE table_name IN (%s, %s)", (old, new)
        ).fetchall()
    assert row == [(old,)]


@pytest.mark.all_servers
def test_a_fence_column_swapped_before_a_rename_is_reported_and_rename_refuses(
    cli: Cli, dsn: str, tmp_path: Path
) -> None:
    _sql(dsn, "CREATE TABLE x (id bigint PRIMARY KEY, v text)", "INSERT INTO x VALUES (1, 'a')")
    assert cli("protect", "x", "--dsn", dsn).code == 0
    _write(dsn, 100, "UPDATE x SET v = 'tok100' WHERE id = 1")
    _sql(
        dsn,
        "ALTER TABLE x RENAME COLUMN fencekit_fence TO ff_old",
        "ALTER TABLE x ADD COLUMN fencekit_fence bigint",
        "ALTER TABLE x RENAME TO x2",
    )
    code, drift = _drift(cli, dsn, "public.x")
    assert code == 1
    assert ("table_renamed", "public.x") in _kinds(drift)
    (d,) = [d for d in drift if d["kind"] == "fence_column_swapped"]
    # Named as the table is called now: the statements of the fix run as printed.
    assert d["object"] == "public.x2.fencekit_fence"
    assert "now named ff_old" in d["message"]

    _rename_refused(cli, dsn, tmp_path, "x", "x2")
    assert _drift(cli, dsn, "public.x")[0] == 1

    # The columns put back, the rename goes through and the old fences hold.
    _sql(
        dsn,
        "ALTER TABLE x2 RENAME COLUMN fencekit_fence TO spare",
        "ALTER TABLE x2 RENAME COLUMN ff_old TO fencekit_fence",
    )
    assert cli("rename", "x", "x2", "--dsn", dsn).code == 0
    with pytest.raises(psycopg.errors.lookup("YF001")):
        _write(dsn, 5, "UPDATE x2 SET v = 'stale5' WHERE id = 1")


@pytest.mark.all_servers
def test_a_key_column_swapped_before_a_rename_is_reported_and_rename_refuses(
    cli: Cli, dsn: str, tmp_path: Path
) -> None:
    _sql(
        dsn,
        "CREATE TABLE y (id bigint PRIMARY KEY, acct int NOT NULL, v text)",
        "INSERT INTO y VALUES (1, 10, 'a')",
    )
    assert cli("protect", "y", "--key", "acct", "--dsn", dsn).code == 0
    _write(dsn, 100, "UPDATE y SET v = 'tok100' WHERE id = 1")
    _sql(
        dsn,
        "ALTER TABLE y RENAME COLUMN acct TO acct_old",
        "ALTER TABLE y RENAME TO y2",
        "ALTER TABLE y2 ADD COLUMN acct int NOT NULL DEFAULT 99",
    )
    code, drift = _drift(cli, dsn, "public.y")
    assert code == 1
    assert ("key_column_swapped", "public.y2.acct") in _kinds(drift), drift
    _rename_refused(cli, dsn, tmp_path, "y", "y2", "--key", "acct")


@pytest.mark.all_servers
def test_a_fence_column_renamed_away_is_not_dropped_and_re_protect_refuses(
    cli: Cli, dsn: str
) -> None:
    _sql(dsn, "CREATE TABLE c (id bigint PRIMARY KEY, v text)", "INSERT INTO c VALUES (1, 'a')")
    assert cli("protect", "c", "--dsn", dsn).code == 0
    _write(dsn, 100, "UPDATE c SET v = 'tok100' WHERE id = 1")
    _sql(dsn, "ALTER TABLE c RENAME COLUMN fencekit_fence TO ff_old")
    code, drift = _drift(cli, dsn, "public.c")
    assert code == 1
    assert "fence_column_missing" not in [d["kind"] for d in drift]
    (d,) = [d for d in drift if d["kind"] == "fence_column_swapped"]
    assert "renamed to ff_old" in d["message"]
    fix = "ALTER TABLE public.c RENAME COLUMN ff_old TO fencekit_fence"
    assert fix in d["fix"]

    r = cli("protect", "c", "--dsn", dsn)
    assert r.code != 0
    assert "was renamed to ff_old" in r.err, r.err
    with psycopg.connect(dsn) as conn:
        cols = conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'c'::regclass "
            "AND attname IN ('fencekit_fence', 'ff_old')"
        ).fetchall()
    assert cols == [("ff_old",)]  # no new, empty fence column was added

    _sql(dsn, fix)
    assert _drift(cli, dsn, "public.c") == (0, [])
    with pytest.raises(psycopg.errors.lookup("YF001")):
        _write(dsn, 5, "UPDATE c SET v = 'stale5' WHERE id = 1")


def test_a_fence_column_dropped_for_good_is_still_dropped(cli: Cli, dsn: str) -> None:
    _sql(dsn, "CREATE TABLE cd (id bigint PRIMARY KEY, v text)")
    assert cli("protect", "cd", "--dsn", dsn).code == 0
    _sql(dsn, "ALTER TABLE cd DROP COLUMN fencekit_fence CASCADE")
    code, drift = _drift(cli, dsn, "public.cd")
    assert code == 1
    assert ("fence_column_missing", "public.cd.fencekit_fence") in _kinds(drift)
    assert "fence_column_swapped" not in [d["kind"] for d in drift]


@pytest.mark.all_servers
def test_a_childs_swap_stays_reported_without_its_insert_trigger_and_protect_refuses(
    cli: Cli, dsn: str
) -> None:
    _sql(
        dsn,
        "CREATE TABLE q (id bigint PRIMARY KEY, v text)",
        "CREATE TABLE qc () INHERITS (q)",
        "INSERT INTO qc VALUES (1, 'a')",
    )
    assert cli("protect", "q", "--dsn", dsn).code == 0
    _write(dsn, 100, "UPDATE q SET v = 'tok100' WHERE id = 1")
    _sql(
        dsn,
        "ALTER TABLE qc NO INHERIT q",
        "ALTER TABLE qc RENAME COLUMN fencekit_fence TO ff_old",
        "ALTER TABLE qc ADD COLUMN fencekit_fence bigint",
        "ALTER TABLE qc INHERIT q",
    )
    with psycopg.connect(dsn) as conn:
        (ins,) = conn.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'qc'::regclass "
            "AND tgname LIKE 'fencekit\\_%\\_ins'"
        ).fetchone() or ("",)
    _sql(dsn, f'DROP TRIGGER "{ins}" ON qc')
    code, drift = _drift(cli, dsn, "public.q")
    assert code == 1
    (d,) = [d for d in drift if d["kind"] == "fence_column_swapped"]
    assert d["object"] == "public.qc.fencekit_fence"
    assert "now named ff_old" in d["message"]

    r = cli("protect", "q", "--dsn", dsn)
    assert r.code != 0
    assert "that one is now named ff_old" in r.err, r.err
    assert _drift(cli, dsn, "public.q")[0] == 1
    # Nothing was bound to the new column: no INSERT trigger came back on the child.
    with psycopg.connect(dsn) as conn:
        back = conn.execute(
            "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'qc'::regclass AND tgname = %s",
            (ins,),
        ).fetchone()
    assert back == (0,)


def test_a_childs_swap_without_any_witness_left_is_refused_once_protect_sets_the_default(
    cli: Cli, dsn: str
) -> None:
    """The owner also dropped every fence DEFAULT in the tree: nothing names the old column
    before protect; the DEFAULT protect sets again does, and protect refuses before it records
    the table as bound."""
    _sql(
        dsn,
        "CREATE TABLE q (id bigint PRIMARY KEY, v text)",
        "CREATE TABLE qc () INHERITS (q)",
        "INSERT INTO qc VALUES (1, 'a')",
    )
    assert cli("protect", "q", "--dsn", dsn).code == 0
    _sql(
        dsn,
        "ALTER TABLE qc NO INHERIT q",
        "ALTER TABLE qc RENAME COLUMN fencekit_fence TO ff_old",
        "ALTER TABLE qc ADD COLUMN fencekit_fence bigint",
        "ALTER TABLE qc INHERIT q",
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        (ins,) = conn.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'qc'::regclass "
            "AND tgname LIKE 'fencekit\\_%\\_ins'"
        ).fetchone() or ("",)
        conn.execute(f'DROP TRIGGER "{ins}" ON qc')
        (default,) = conn.execute(
            "SELECT adbin::text FROM pg_attrdef WHERE adrelid = 'qc'::regclass"
        ).fetchone() or ("",)
        conn.execute("ALTER TABLE q ALTER COLUMN fencekit_fence DROP DEFAULT")
        conn.execute("ALTER TABLE qc ALTER COLUMN fencekit_fence DROP DEFAULT")
    assert default  # ff_old keeps fencekit's DEFAULT: the witness protect finds again
    r = cli("protect", "q", "--dsn", dsn)
    assert r.code != 0
    assert "that one is now named ff_old" in r.err, r.err


def test_a_key_column_renamed_away_is_reported_as_renamed_and_re_protect_refuses(
    cli: Cli, dsn: str
) -> None:
    """The key triggers then fail (writes are refused); the fix renames the column back."""
    _sql(dsn, "CREATE TABLE kc (id bigint PRIMARY KEY, acct int NOT NULL, v text)")
    assert cli("protect", "kc", "--key", "acct", "--dsn", dsn).code == 0
    _sql(dsn, "ALTER TABLE kc RENAME COLUMN acct TO acct_old")
    code, drift = _drift(cli, dsn, "public.kc")
    assert code == 1
    (d,) = [d for d in drift if d["kind"] == "key_column_swapped"]
    assert "renamed to acct_old" in d["message"]
    fix = "ALTER TABLE public.kc RENAME COLUMN acct_old TO acct"
    assert fix in d["fix"]
    # Re-protect refuses: the CLI before anything runs (no key column of that name).
    assert cli("protect", "kc", "--key", "acct", "--dsn", dsn).code != 0
    _sql(dsn, fix)
    assert _drift(cli, dsn, "public.kc") == (0, [])


def test_a_move_that_keeps_the_key_columns_refuses_a_swapped_one(cli: Cli, dsn: str) -> None:
    """Moving a key fence to another resource copies its fences by key and reads no row; it
    must still not bind the new protection to a key column swapped in under the name."""
    _sql(dsn, "CREATE TABLE km (id bigint PRIMARY KEY, acct int NOT NULL, v text)")
    assert cli("protect", "km", "--key", "acct", "--dsn", dsn).code == 0
    _sql(
        dsn,
        "ALTER TABLE km RENAME COLUMN acct TO acct_old",
        "ALTER TABLE km ADD COLUMN acct int NOT NULL DEFAULT 99",
    )
    r = cli("move", "km", "--key", "acct", "--resource", "other", "--dsn", dsn)
    assert r.code != 0
    assert "is not the column it was protected with" in r.err, r.err
    assert ("key_column_swapped", "public.km.acct") in _kinds(_drift(cli, dsn, "public.km")[1])


def test_auto_cover_refuses_to_bind_a_childs_swapped_column(cli: Cli, dsn: str) -> None:
    """The owner strips the child of fencekit's triggers while it is out of the tree and swaps
    its fence column: putting it back would have auto-cover bind the triggers to the new
    column. The fence DEFAULT left on the old one names it, and the INHERIT is refused."""
    _sql(
        dsn,
        "CREATE TABLE q (id bigint PRIMARY KEY, v text)",
        "CREATE TABLE qc () INHERITS (q)",
        "INSERT INTO qc VALUES (1, 'a')",
    )
    assert cli("protect", "q", "--dsn", dsn).code == 0
    assert cli("auto-cover", "on", "--dsn", dsn).code == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE qc NO INHERIT q")
        for (name,) in conn.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'qc'::regclass AND NOT tgisinternal"
        ).fetchall():
            conn.execute(f'DROP TRIGGER "{name}" ON qc')
        conn.execute("ALTER TABLE qc RENAME COLUMN fencekit_fence TO ff_old")
        conn.execute("ALTER TABLE qc ADD COLUMN fencekit_fence bigint")
        with pytest.raises(psycopg.errors.lookup("YF000")) as caught:
            conn.execute("ALTER TABLE qc INHERIT q")
    assert "that one is now named ff_old" in str(caught.value)
