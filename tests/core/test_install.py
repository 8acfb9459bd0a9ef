"""Core install and upgrades; protect is idempotent, online and exactly reversible."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fencekit import sqlgen
from fencekit.spec import FenceSpec, Scope, TableName
from tests.core.helpers import (
    MALFORMED,
    MISSING,
    STALE,
    Conn,
    key_fence,
    one,
    protect,
    reject,
    rejection_count,
    rows,
    run_script,
    unprotect,
    write,
)

FIXTURES = Path(__file__).parent / "fixtures"
PG_DUMP_15 = "/usr/lib/postgresql/15/bin/pg_dump"


# ---------------------------------------------------------------- core version and upgrade


@pytest.mark.all_servers
def test_core_install_records_its_version(db: Conn) -> None:
    assert one(db, "SELECT value FROM fencekit.meta WHERE key = 'core_version'") == str(
        sqlgen.CORE_VERSION
    )


def _state(conn: Conn) -> dict[str, Any]:
    """Everything an upgrade must leave alone: data, storage, fences, registry."""
    return {
        "up_row": rows(conn, "SELECT * FROM up_row ORDER BY id"),
        "up_key": rows(conn, "SELECT * FROM up_key ORDER BY k, v"),
        "up_tab": rows(conn, "SELECT * FROM up_tab ORDER BY v"),
        "files": rows(
            conn,
            "SELECT relname, relfilenode FROM pg_class "
            "WHERE relname IN ('up_row', 'up_key', 'up_tab') ORDER BY 1",
        ),
        "fences": rows(conn, "SELECT resource, key, fence FROM fencekit.fences ORDER BY 1, 2"),
        "protected": rows(
            conn,
            "SELECT schema_name, table_name, tag, spec, template_version "
            "FROM fencekit.protected ORDER BY 2",
        ),
    }


def _still_fenced(conn: Conn, fence: int) -> None:
    reject(conn, STALE, fence - 1, "UPDATE up_row SET v = 'stale'")
    reject(conn, STALE, fence - 1, "INSERT INTO up_key VALUES (1, 'stale')")
    reject(conn, STALE, fence - 1, "INSERT INTO up_tab VALUES ('stale')")
    reject(conn, MISSING, None, "DELETE FROM up_row")
    reject(conn, MALFORMED, "1e3", "DELETE FROM up_key")


@pytest.mark.all_servers
def test_upgrade_from_the_prerelease_objects(raw_db: Conn) -> None:
    """core-prerelease.sql and protect-prerelease.sql are the objects fencekit generated before
    its first release. Installing the current core and re-protecting (what `fencekit install`
    does) keeps data, storage and fences, and leaves only the current objects."""
    run_script(raw_db, (FIXTURES / "core-prerelease.sql").read_text(encoding="utf-8"))
    assert one(raw_db, "SELECT value FROM fencekit.meta WHERE key = 'core_version'") == "2"
    raw_db.execute("CREATE TABLE up_row (id int PRIMARY KEY, v text)")
    raw_db.execute("CREATE TABLE up_key (k int NOT NULL, v text)")
    raw_db.execute("CREATE TABLE up_tab (v text)")
    raw_db.commit()
    run_script(raw_db, (FIXTURES / "protect-prerelease.sql").read_text(encoding="utf-8"))
    write(raw_db, 10, "INSERT INTO up_row VALUES (1, 'a'), (2, 'b')")
    write(raw_db, 10, "INSERT INTO up_key VALUES (1, 'a'), (2, 'b')")
    write(raw_db, 10, "INSERT INTO up_tab VALUES ('a')")
    _still_fenced(raw_db, 10)
    before = _state(raw_db)
    stale_before = rejection_count(raw_db, "up_row", "stale")

    run_script(raw_db, sqlgen.render_install())
    version = one(raw_db, "SELECT value FROM fencekit.meta WHERE key = 'core_version'")
    assert version == str(sqlgen.CORE_VERSION)
    assert _state(raw_db) == before
    protect(raw_db, "up_row")
    protect(raw_db, "up_key", "key", key=("k",))
    protect(raw_db, "up_tab", "table")
    after = _state(raw_db)
    assert {k: v for k, v in after.items() if k != "protected"} == {
        k: v for k, v in before.items() if k != "protected"
    }
    assert {r[4] for r in after["protected"]} == {sqlgen.TEMPLATE_VERSION}
    # Nothing of the old generation is left to fire beside the new one.
    for name in ("up_row", "up_key", "up_tab"):
        spec = FenceSpec(
            TableName("public", name),
            scope={"up_row": Scope.ROW, "up_key": Scope.KEY, "up_tab": Scope.TABLE}[name],
            key=("k",) if name == "up_key" else (),
        )
        objs = sqlgen.table_objects(spec)
        triggers = rows(
            raw_db,
            "SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal "
            "ORDER BY 1",
            [name],
        )
        assert [t for (t,) in triggers] == sorted(tr.name for tr in objs.triggers)
        functions = rows(
            raw_db,
            "SELECT proname FROM pg_proc WHERE pronamespace = 'fencekit'::regnamespace "
            "AND left(proname, %s) = %s ORDER BY 1",
            [len(objs.tag) + 1, objs.tag + "_"],
        )
        assert [f for (f,) in functions] == sorted(f.name for f in objs.functions)
    _still_fenced(raw_db, 10)
    assert rejection_count(raw_db, "up_row", "stale") == stale_before + 1  # counters survive
    write(raw_db, 11, "UPDATE up_row SET v = 'new core' WHERE id = 1")
    write(raw_db, 11, "INSERT INTO up_key VALUES (1, 'new core')")
    write(raw_db, 11, "INSERT INTO up_tab VALUES ('new core')")
    run_script(raw_db, sqlgen.render_install())  # re-installing changes nothing
    _still_fenced(raw_db, 11)


# ---------------------------------------------------------------- idempotent protect


def _catalog(conn: Conn, table: str) -> dict[str, Any]:
    """What protect creates or changes, by identity (OIDs) and definition."""
    return {
        "triggers": rows(
            conn,
            "SELECT t.tgrelid::regclass::text, t.tgname, t.oid, t.tgfoid, t.tgenabled, "
            "pg_get_triggerdef(t.oid), obj_description(t.oid, 'pg_trigger') "
            "FROM pg_trigger t WHERE t.tgname LIKE 'fencekit%' ORDER BY 1, 2",
        ),
        "functions": rows(
            conn,
            "SELECT p.oid, pg_get_functiondef(p.oid), obj_description(p.oid, 'pg_proc') "
            "FROM pg_proc p WHERE p.pronamespace = 'fencekit'::regnamespace "
            "AND p.prorettype = 'trigger'::regtype ORDER BY 1",
        ),
        "columns": rows(
            conn,
            "SELECT attnum, attname, atttypid, attnotnull, atthasdef "
            "FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 ORDER BY 1",
            (table,),
        ),
        "registry": rows(conn, "SELECT *, xmin::text FROM fencekit.protected ORDER BY 1, 2"),
        "sequences": rows(
            conn,
            "SELECT oid, relname FROM pg_class WHERE relkind = 'S' "
            "AND relnamespace = 'fencekit'::regnamespace ORDER BY 2",
        ),
        "relfilenode": one(
            conn, "SELECT relfilenode FROM pg_class WHERE oid = %s::regclass", (table,)
        ),
    }


@pytest.mark.all_servers
@pytest.mark.parametrize("scope", ["row", "key", "table"])
def test_protect_twice_is_a_no_op(db: Conn, scope: str) -> None:
    db.execute("CREATE TABLE twice (k int NOT NULL, v text) PARTITION BY LIST (k)")
    db.execute("CREATE TABLE twice_1 PARTITION OF twice FOR VALUES IN (1)")
    db.commit()
    kw: dict[str, Any] = {"key": ("k",)} if scope == "key" else {}
    protect(db, "twice", scope, **kw)
    write(db, 5, "INSERT INTO twice VALUES (1, 'a')")
    reject(db, STALE, 4, "UPDATE twice SET v = 'stale'")
    first = _catalog(db, "twice")
    protect(db, "twice", scope, **kw)
    assert _catalog(db, "twice") == first
    # State lives on: the rejection count and the fences are not reset.
    assert rejection_count(db, "twice", "stale") == 1
    reject(db, STALE, 4, "UPDATE twice SET v = 'stale'")


# ---------------------------------------------------------------- online protect


@pytest.mark.slow
@pytest.mark.parametrize("scope", ["row", "key"])
def test_protect_a_million_rows_rewrites_and_reads_nothing(db: Conn, scope: str) -> None:
    db.execute("CREATE TABLE big (k int NOT NULL, v int)")
    db.execute("INSERT INTO big SELECT g % 1000, g FROM generate_series(1, 1000000) g")
    db.commit()
    node = one(db, "SELECT relfilenode FROM pg_class WHERE oid = 'big'::regclass")
    spec = FenceSpec(
        TableName.parse("big"), scope=Scope(scope), key=("k",) if scope == "key" else ()
    )
    # Run the script's statements in one transaction and look inside it before COMMIT.
    db.execute("SET LOCAL lock_timeout = '5s'")
    scans = (
        "SELECT seq_scan, seq_tup_read FROM pg_stat_xact_user_tables WHERE relid = 'big'::regclass"
    )
    scanned_before = db.execute(scans).fetchone()
    started = time.monotonic()
    for stmt in sqlgen.protect_statements(spec):
        db.execute(stmt)
    elapsed = time.monotonic() - started
    assert db.execute(scans).fetchone() == scanned_before, "protect scanned the table"
    held = {
        r[0]
        for r in db.execute(
            "SELECT mode FROM pg_locks WHERE relation = 'big'::regclass "
            "AND pid = pg_backend_pid() AND granted"
        ).fetchall()
    }
    db.commit()
    assert one(db, "SELECT relfilenode FROM pg_class WHERE oid = 'big'::regclass") == node
    # The only locks are DDL locks (held for catalog changes), never data reads.
    ddl_locks = {
        "AccessExclusiveLock",  # ADD COLUMN: catalog only (nullable, no default)
        "ShareRowExclusiveLock",  # CREATE TRIGGER
        "ShareUpdateExclusiveLock",  # COMMENT
        "AccessShareLock",
    }
    assert held <= ddl_locks, held
    # Catalog-only work: far below what touching a million rows costs (not a benchmark, a
    # bound two orders of magnitude loose).
    assert elapsed < 30, elapsed
    write(db, 3, "UPDATE big SET v = -v WHERE v <= 10")
    reject(db, STALE, 2, "UPDATE big SET v = 0 WHERE v = -1")


@pytest.mark.all_servers
def test_protect_fails_fast_on_a_conflicting_lock(db: Conn, dsn: str) -> None:
    db.execute("CREATE TABLE busy (id int PRIMARY KEY, v text)")
    db.execute("INSERT INTO busy VALUES (1, 'a')")
    db.commit()
    spec = FenceSpec(TableName.parse("busy"))
    with psycopg.connect(dsn) as reader:
        reader.execute("SELECT * FROM busy")  # an open transaction holds ACCESS SHARE
        started = time.monotonic()
        with pytest.raises(psycopg.errors.LockNotAvailable):
            run_script(db, sqlgen.render_protect(spec, lock_timeout="300ms"))
        waited = time.monotonic() - started
        reader.rollback()
    assert waited < 10, waited  # gave up after its lock_timeout, did not queue behind readers
    # Nothing half-done: the script is one transaction.
    assert one(db, "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'busy'::regclass") == 0
    assert one(db, "SELECT count(*) FROM fencekit.protected") == 0
    run_script(db, sqlgen.render_protect(spec, lock_timeout="300ms"))  # no lock held: succeeds
    reject(db, MISSING, None, "UPDATE busy SET v = 'b'")


# ---------------------------------------------------------------- exact unprotect


def _dump_schema(dsn: str) -> str:
    out = subprocess.run(  # noqa: S603 - fixed binary, our own test database
        [PG_DUMP_15, "--schema-only", "-d", dsn],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    # Drop what differs between any two runs: version banners and psql's random \restrict key.
    noise = ("-- Dumped", "\\restrict", "\\unrestrict")
    return "\n".join(line for line in out.splitlines() if not line.startswith(noise))


@pytest.mark.parametrize("pg_target", ["debian15"], indirect=True)
def test_unprotect_restores_the_schema_exactly(
    db: Conn, dsn: str, request: pytest.FixtureRequest
) -> None:
    if "debian15" not in str(request.config.getoption("--pg")):
        pytest.skip("needs the debian15 server (pg_dump 15 only dumps a PostgreSQL 15 server)")
    if not shutil.which(PG_DUMP_15):
        pytest.skip(f"{PG_DUMP_15} missing: apt-get install postgresql-15")
    db.execute(
        """CREATE TABLE acct (id int PRIMARY KEY, owner text NOT NULL DEFAULT 'x',
                              n int CHECK (n >= 0));
           CREATE INDEX acct_owner ON acct (owner);
           COMMENT ON TABLE acct IS 'accounts';
           CREATE FUNCTION acct_touch() RETURNS trigger LANGUAGE plpgsql
             AS $$ BEGIN NEW.n := coalesce(NEW.n, 0); RETURN NEW; END $$;
           CREATE TRIGGER acct_touch BEFORE INSERT ON acct FOR EACH ROW
             EXECUTE FUNCTION acct_touch();
           CREATE TABLE ledger (account int NOT NULL, amount int) PARTITION BY RANGE (account);
           CREATE TABLE ledger_a PARTITION OF ledger FOR VALUES FROM (0) TO (100);
           CREATE TABLE ledger_b PARTITION OF ledger FOR VALUES FROM (100) TO (200);
           CREATE TABLE "Report Q1" (v text);
           INSERT INTO acct (id, owner) VALUES (1, 'a');
           INSERT INTO ledger VALUES (1, 10), (150, 20);"""
    )
    db.commit()
    before = _dump_schema(dsn)
    data = rows(db, "SELECT id, owner, n FROM acct")
    specs = [
        FenceSpec(TableName.parse("acct")),
        FenceSpec(TableName.parse("ledger"), scope=Scope.KEY, key=("account",), resource="l"),
        FenceSpec(TableName.parse('"Report Q1"'), scope=Scope.TABLE, issuer="etcd"),
    ]
    for spec in specs:
        run_script(db, sqlgen.render_protect(spec))
    write(db, 5, "UPDATE acct SET n = 1")
    write(db, 5, "INSERT INTO ledger VALUES (2, 1)")
    write(db, 5, "INSERT INTO \"Report Q1\" VALUES ('r')")
    reject(db, STALE, 4, "UPDATE acct SET n = 2")
    assert _dump_schema(dsn) != before  # protect did change the schema
    for spec in reversed(specs):
        unprotect(db, spec)
    assert _dump_schema(dsn) == before
    assert rows(db, "SELECT id, owner, n FROM acct") == [(i, o, 1) for i, o, _ in data]
    assert rows(db, "SELECT count(*) FROM fencekit.fences") == [(0,)]
    assert rows(db, "SELECT count(*) FROM fencekit.resources") == [(0,)]
    write(db, None, "UPDATE acct SET n = 3")  # no fence left: a plain table again
    assert key_fence(db, "l", "2") is None
