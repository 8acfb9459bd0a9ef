"""A table's owner swaps a column fencekit's objects read by name: renames the fence column (or
a key column) away and adds another under its name. The row triggers and the key fence's
triggers read columns by name, so they now judge writes by the new column; the INSERT trigger's
WHEN clause and the column DEFAULT stay bound to the old one by attnum. ``fencekit status``
reports it (``fence_column_swapped``, ``key_column_swapped``), re-protect refuses to bind
fencekit's objects to the new column (the fences stay in the old one), and renaming the columns
back, as status prints, restores the fences."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from .conftest import Cli

OWNER = "fk_swap_owner"  # owns the tables (cluster-wide: make_role drops them after the test)
WRITER = "fk_swap_writer"


def _sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for stmt in statements:
            conn.execute(stmt)


def _as(dsn: str, role: str, *statements: str) -> None:
    """Run ``statements`` as ``role`` (SET ROLE from the superuser's session)."""
    _sql(dsn, f"SET ROLE {role}", *statements)


def _write(dsn: str, token: int, statement: str) -> None:
    """One fenced write by the writer role with ``token``: raises what fencekit raises."""
    with psycopg.connect(dsn) as conn:
        conn.execute(f"SET ROLE {WRITER}")
        conn.execute("SELECT set_config('fencekit.token', %s, true)", (str(token),))
        conn.execute(statement)


def _drift(cli: Cli, dsn: str, table: str) -> tuple[int, list[dict[str, Any]]]:
    r = cli("status", "--json", "--dsn", dsn)
    (t,) = [t for t in json.loads(r.out)["tables"] if t["table"] == table]
    return r.code, list(t["drift"])


@pytest.fixture
def roles(make_role: Callable[..., str]) -> None:
    make_role(OWNER, "CREATE ON SCHEMA public")
    make_role(WRITER)


def _owned(dsn: str, *statements: str) -> None:
    """Create tables as the owner; the writer may write them."""
    _as(dsn, OWNER, *statements)


@pytest.mark.all_servers
def test_a_swapped_fence_column_is_reported_and_re_protect_refuses(
    cli: Cli, dsn: str, roles: None
) -> None:
    _owned(
        dsn,
        "CREATE TABLE t (id bigint PRIMARY KEY, v text)",
        "INSERT INTO t VALUES (1, 'a')",
    )
    _sql(dsn, f"GRANT ALL ON t TO {WRITER}")
    assert cli("protect", "t", "--dsn", dsn).code == 0
    _write(dsn, 5, "UPDATE t SET v = 'x5' WHERE id = 1")
    with pytest.raises(psycopg.errors.lookup("YF001")):
        _write(dsn, 3, "UPDATE t SET v = 'x3' WHERE id = 1")
    assert _drift(cli, dsn, "public.t") == (0, [])

    # The owner swaps the column: no EXECUTE on anything of fencekit's needed.
    _as(
        dsn,
        OWNER,
        "ALTER TABLE t RENAME COLUMN fencekit_fence TO old_fence",
        "ALTER TABLE t ADD COLUMN fencekit_fence bigint",
    )
    code, drift = _drift(cli, dsn, "public.t")
    assert code == 1
    (d,) = [d for d in drift if d["kind"] == "fence_column_swapped"]
    assert d["object"] == "public.t.fencekit_fence"
    assert "now named old_fence" in d["message"]
    assert "the rows' fences stay in old_fence" in d["message"]
    assert "ALTER TABLE public.t RENAME COLUMN old_fence TO fencekit_fence" in d["fix"]
    assert "fencekit unprotect public.t" in d["fix"]
    # The new column has no DEFAULT either: that is the same swap, not a second drift.
    assert [x["kind"] for x in drift] == ["fence_column_swapped"]
    # What it lets in: a stale write, judged by the new column's (absent) fence.
    _write(dsn, 3, "UPDATE t SET v = 'stale3' WHERE id = 1")

    # Re-protect would bind the INSERT trigger and the DEFAULT to the new column: refused.
    r = cli("protect", "t", "--dsn", dsn)
    assert r.code != 0
    assert "column fencekit_fence of public.t is not the column it was protected with" in r.err
    assert "now named old_fence" in r.err

    # The fix status prints: the old column, holding the fences, back under its name.
    _as(
        dsn,
        OWNER,
        "ALTER TABLE t RENAME COLUMN fencekit_fence TO spare",
        "ALTER TABLE t RENAME COLUMN old_fence TO fencekit_fence",
    )
    assert _drift(cli, dsn, "public.t") == (0, [])
    with pytest.raises(psycopg.errors.lookup("YF001")):
        _write(dsn, 3, "UPDATE t SET v = 'stale3' WHERE id = 1")
    assert cli("protect", "t", "--dsn", dsn).code == 0


def test_a_dropped_and_re_added_fence_column_is_reported(cli: Cli, dsn: str) -> None:
    """Dropping the fence column takes fencekit's INSERT trigger with it (its WHEN clause
    depends on the column); the new column under the old name is still not the one protected."""
    _sql(dsn, "CREATE TABLE t (id bigint PRIMARY KEY, v text)", "INSERT INTO t VALUES (1, 'a')")
    assert cli("protect", "t", "--dsn", dsn).code == 0
    _sql(
        dsn,
        "ALTER TABLE t DROP COLUMN fencekit_fence CASCADE",
        "ALTER TABLE t ADD COLUMN fencekit_fence bigint",
    )
    code, drift = _drift(cli, dsn, "public.t")
    assert code == 1
    (d,) = [d for d in drift if d["kind"] == "fence_column_swapped"]
    assert "was dropped" in d["message"]
    assert "fencekit unprotect public.t" in d["fix"]
    r = cli("protect", "t", "--dsn", dsn)
    assert r.code != 0
    assert "was dropped" in r.err
    # A move would carry the fences from the new column: refused too, nothing changed.
    r = cli("move", "t", "--key", "id", "--dsn", dsn)
    assert r.code != 0
    assert "column fencekit_fence of public.t is not the column it was protected with" in r.err
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT spec ->> 'scope' FROM fencekit.protected").fetchone()
    assert row == ("row",)


@pytest.mark.all_servers
def test_a_swapped_key_column_is_reported_and_re_protect_refuses(
    cli: Cli, dsn: str, roles: None
) -> None:
    _owned(
        dsn,
        "CREATE TABLE kf (tenant bigint NOT NULL, id bigint, v text)",
        "INSERT INTO kf VALUES (1, 1, 'a')",
    )
    _sql(dsn, f"GRANT ALL ON kf TO {WRITER}")
    assert cli("protect", "kf", "--scope", "key", "--key", "tenant", "--dsn", dsn).code == 0
    _write(dsn, 5, "UPDATE kf SET v = 'x5' WHERE tenant = 1")
    assert _drift(cli, dsn, "public.kf") == (0, [])
    _as(
        dsn,
        OWNER,
        "ALTER TABLE kf RENAME COLUMN tenant TO tenant_old",
        "ALTER TABLE kf ADD COLUMN tenant bigint NOT NULL DEFAULT 1000",
    )
    code, drift = _drift(cli, dsn, "public.kf")
    assert code == 1
    (d,) = [d for d in drift if d["kind"] == "key_column_swapped"]
    assert d["object"] == "public.kf.tenant"
    assert "now named tenant_old" in d["message"]
    assert "ALTER TABLE public.kf RENAME COLUMN tenant_old TO tenant" in d["fix"]
    # What it lets in: a stale write to key 1, judged under key 1000.
    _write(dsn, 3, "UPDATE kf SET v = 'stale3' WHERE tenant_old = 1")
    r = cli("protect", "kf", "--scope", "key", "--key", "tenant", "--dsn", dsn)
    assert r.code != 0
    assert "column tenant of public.kf is not the column it was protected with" in r.err

    _as(
        dsn,
        OWNER,
        "ALTER TABLE kf RENAME COLUMN tenant TO spare",
        "ALTER TABLE kf RENAME COLUMN tenant_old TO tenant",
    )
    assert _drift(cli, dsn, "public.kf") == (0, [])
    with pytest.raises(psycopg.errors.lookup("YF001")):
        _write(dsn, 3, "UPDATE kf SET v = 'stale3' WHERE tenant = 1")


@pytest.mark.all_servers
def test_a_swapped_fence_column_on_an_inheritance_child_is_reported(cli: Cli, dsn: str) -> None:
    """An inherited column cannot be renamed on the child; taken out of the tree, swapped and
    put back (NO INHERIT, INHERIT: the child keeps fencekit's triggers), it is the new one."""
    _sql(
        dsn,
        "CREATE TABLE p (id bigint PRIMARY KEY, v text)",
        "CREATE TABLE c () INHERITS (p)",
        "INSERT INTO c VALUES (1, 'a')",
    )
    assert cli("protect", "p", "--dsn", dsn).code == 0
    assert _drift(cli, dsn, "public.p") == (0, [])
    _sql(
        dsn,
        "ALTER TABLE c NO INHERIT p",
        "ALTER TABLE c RENAME COLUMN fencekit_fence TO old_fence",
        "ALTER TABLE c ADD COLUMN fencekit_fence bigint",
        "ALTER TABLE c INHERIT p",
    )
    code, drift = _drift(cli, dsn, "public.p")
    assert code == 1
    (d,) = [d for d in drift if d["kind"] == "fence_column_swapped"]
    assert d["object"] == "public.c.fencekit_fence"
    assert "child table public.c" in d["message"]
    assert "now named old_fence" in d["message"]
    # The fix: an inherited column is renamed only out of the tree.
    fix = (
        "ALTER TABLE public.c NO INHERIT public.p; ALTER TABLE public.c RENAME COLUMN "
        "fencekit_fence TO <spare name>; ALTER TABLE public.c RENAME COLUMN old_fence TO "
        "fencekit_fence; ALTER TABLE public.c INHERIT public.p "
    )
    assert fix in d["fix"]
    _sql(dsn, *fix.replace("<spare name>", "spare").strip().split("; "))
    assert _drift(cli, dsn, "public.p") == (0, [])


def test_a_partition_without_the_fence_default_is_reported(cli: Cli, dsn: str) -> None:
    """A partition keeps its own DEFAULTs: one attached without the fence column's runs
    fencekit's INSERT trigger for every row. Re-protect sets it on every partition."""
    _sql(
        dsn,
        "CREATE TABLE ev (id bigint NOT NULL, day int NOT NULL) PARTITION BY RANGE (day)",
        "CREATE TABLE ev_1 PARTITION OF ev FOR VALUES FROM (1) TO (10)",
    )
    assert cli("protect", "ev", "--dsn", dsn).code == 0
    assert _drift(cli, dsn, "public.ev") == (0, [])
    _sql(dsn, "ALTER TABLE ev_1 ALTER COLUMN fencekit_fence DROP DEFAULT")
    code, drift = _drift(cli, dsn, "public.ev")
    assert code == 1
    (d,) = drift
    assert d["kind"] == "fence_default_missing"
    assert d["object"] == "public.ev_1.fencekit_fence"
    assert cli("protect", "ev", "--dsn", dsn).code == 0
    assert _drift(cli, dsn, "public.ev") == (0, [])


def test_a_table_fence_binds_no_column(cli: Cli, dsn: str) -> None:
    """A table fence's triggers read no column: nothing of the table's can be swapped."""
    _sql(dsn, "CREATE TABLE tf (id bigint PRIMARY KEY)")
    assert cli("protect", "tf", "--scope", "table", "--dsn", dsn).code == 0
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT table_oid = 'tf'::regclass, attnums FROM fencekit.protected "
            "WHERE table_name = 'tf'"
        ).fetchone()
    assert row == (True, None)
    _sql(dsn, "ALTER TABLE tf RENAME COLUMN id TO id_old", "ALTER TABLE tf ADD COLUMN id bigint")
    assert _drift(cli, dsn, "public.tf") == (0, [])


def test_a_swap_on_a_partitioned_table_is_one_drift_and_renaming_back_fixes_it(
    cli: Cli, dsn: str, roles: None
) -> None:
    """RENAME COLUMN and ADD COLUMN on a partitioned table reach every partition, and so does
    the fix: status reports the table once, not each partition."""
    _sql(
        dsn,
        "CREATE TABLE ev (id bigint NOT NULL, day int NOT NULL, v text) PARTITION BY RANGE (day)",
        "CREATE TABLE ev_1 PARTITION OF ev FOR VALUES FROM (1) TO (10)",
        "CREATE TABLE ev_2 PARTITION OF ev FOR VALUES FROM (10) TO (20)",
        "INSERT INTO ev VALUES (1, 1, 'a'), (2, 11, 'b')",
        f"GRANT ALL ON ev TO {WRITER}",
    )
    assert cli("protect", "ev", "--dsn", dsn).code == 0
    _write(dsn, 5, "UPDATE ev SET v = 'x5'")
    _sql(
        dsn,
        "ALTER TABLE ev RENAME COLUMN fencekit_fence TO old_fence",
        "ALTER TABLE ev ADD COLUMN fencekit_fence bigint",
    )
    _write(dsn, 3, "UPDATE ev SET v = 'stale3' WHERE id = 2")  # what it lets in
    code, drift = _drift(cli, dsn, "public.ev")
    assert code == 1
    assert [(d["kind"], d["object"]) for d in drift] == [
        ("fence_column_swapped", "public.ev.fencekit_fence")
    ]
    _sql(
        dsn,
        "ALTER TABLE ev RENAME COLUMN fencekit_fence TO spare",
        "ALTER TABLE ev RENAME COLUMN old_fence TO fencekit_fence",
    )
    assert _drift(cli, dsn, "public.ev") == (0, [])
    with pytest.raises(psycopg.errors.lookup("YF001")):
        _write(dsn, 3, "UPDATE ev SET v = 'stale3' WHERE id = 1")


def test_a_swapped_key_column_of_a_partitioned_table_is_reported(
    cli: Cli, dsn: str, roles: None
) -> None:
    _sql(
        dsn,
        "CREATE TABLE kp (tenant bigint NOT NULL, day int NOT NULL, v text)"
        " PARTITION BY RANGE (day)",
        "CREATE TABLE kp_1 PARTITION OF kp FOR VALUES FROM (1) TO (10)",
        "INSERT INTO kp VALUES (1, 1, 'a')",
        f"GRANT ALL ON kp TO {WRITER}",
    )
    assert cli("protect", "kp", "--key", "tenant", "--dsn", dsn).code == 0
    _write(dsn, 5, "UPDATE kp SET v = 'x5' WHERE tenant = 1")
    _sql(
        dsn,
        "ALTER TABLE kp RENAME COLUMN tenant TO tenant_old",
        "ALTER TABLE kp ADD COLUMN tenant bigint NOT NULL DEFAULT 1000",
    )
    _write(dsn, 3, "UPDATE kp SET v = 'stale3' WHERE tenant_old = 1")  # what it lets in
    code, drift = _drift(cli, dsn, "public.kp")
    assert code == 1
    assert [(d["kind"], d["object"]) for d in drift] == [("key_column_swapped", "public.kp.tenant")]


def test_unprotect_and_protect_again_after_a_swap_restarts_the_fences(
    cli: Cli, dsn: str, roles: None
) -> None:
    """The other fix status prints: the fences restart on the new column; the old one stays,
    the table's owner's to drop."""
    _sql(
        dsn,
        "CREATE TABLE t (id bigint PRIMARY KEY, v text)",
        "INSERT INTO t VALUES (1, 'a')",
        f"GRANT ALL ON t TO {WRITER}",
    )
    assert cli("protect", "t", "--dsn", dsn).code == 0
    _write(dsn, 5, "UPDATE t SET v = 'x5'")
    _sql(
        dsn,
        "ALTER TABLE t RENAME COLUMN fencekit_fence TO old_fence",
        "ALTER TABLE t ADD COLUMN fencekit_fence bigint",
    )
    assert cli("unprotect", "t", "--dsn", dsn).code == 0
    assert cli("protect", "t", "--dsn", dsn).code == 0
    assert _drift(cli, dsn, "public.t") == (0, [])
    _write(dsn, 3, "UPDATE t SET v = 'x3'")
    with pytest.raises(psycopg.errors.lookup("YF001")):
        _write(dsn, 2, "UPDATE t SET v = 'x2'")
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT old_fence, fencekit_fence FROM t").fetchall() == [(5, 3)]


def test_after_a_restore_the_recorded_columns_are_not_compared_until_protect_runs(
    cli: Cli, dsn: str
) -> None:
    """A restore gives the table (and its functions) another oid and renumbers its columns past
    a dropped one: the attnums recorded for the old oid are not compared (no false swap),
    status asks for protect, and protect records them again. fencekit.protected is written here
    as a restore leaves it (tests/security/test_restore_identity.py restores for real)."""
    _sql(
        dsn,
        "CREATE TABLE kr (gone int, tenant bigint NOT NULL, v text)",
        "ALTER TABLE kr DROP COLUMN gone",
    )
    assert cli("protect", "kr", "--key", "tenant", "--dsn", dsn).code == 0
    _sql(
        dsn,
        "UPDATE fencekit.protected SET table_oid = 1, attnums = '{1}', function_oid = 1 "
        "WHERE table_name = 'kr'",
    )
    code, drift = _drift(cli, dsn, "public.kr")
    assert code == 1
    assert [d["kind"] for d in drift] == ["table_oid_stale"]
    assert cli("protect", "kr", "--key", "tenant", "--dsn", dsn).code == 0
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT table_oid = 'kr'::regclass, attnums FROM fencekit.protected "
            "WHERE table_name = 'kr'"
        ).fetchone()
    assert row == (True, [2])
    assert _drift(cli, dsn, "public.kr") == (0, [])
    _sql(
        dsn,
        "ALTER TABLE kr RENAME COLUMN tenant TO tenant_old",
        "ALTER TABLE kr ADD COLUMN tenant bigint NOT NULL DEFAULT 1",
    )
    assert _drift(cli, dsn, "public.kr")[0] == 1


def test_a_partition_whose_fence_column_was_replaced_while_detached_is_reported(
    cli: Cli, dsn: str
) -> None:
    """Detached, a partition's fence column can be dropped and added again (a partition may
    hold no column its parent lacks, so the old one cannot stay); attached again, PostgreSQL
    binds fencekit's cloned INSERT trigger to the new column, which lacks the fence DEFAULT."""
    _sql(
        dsn,
        "CREATE TABLE ev (id bigint NOT NULL, day int NOT NULL) PARTITION BY RANGE (day)",
        "CREATE TABLE ev_1 PARTITION OF ev FOR VALUES FROM (1) TO (10)",
    )
    assert cli("protect", "ev", "--dsn", dsn).code == 0
    _sql(
        dsn,
        "ALTER TABLE ev DETACH PARTITION ev_1",
        "ALTER TABLE ev_1 DROP COLUMN fencekit_fence CASCADE",
        "ALTER TABLE ev_1 ADD COLUMN fencekit_fence bigint",
        "ALTER TABLE ev ATTACH PARTITION ev_1 FOR VALUES FROM (1) TO (10)",
    )
    code, drift = _drift(cli, dsn, "public.ev")
    assert code == 1
    assert ("fence_default_missing", "public.ev_1.fencekit_fence") in [
        (d["kind"], d["object"]) for d in drift
    ], drift
