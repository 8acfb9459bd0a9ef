"""Core install and upgrades; protect is idempotent, online and exactly reversible."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from fencekit import catalog, sqlgen
from fencekit.cli import main
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

PG_DUMP_15 = "/usr/lib/postgresql/15/bin/pg_dump"


# ---------------------------------------------------------------- core version and upgrade


@pytest.mark.all_servers
def test_core_install_records_its_version(db: Conn) -> None:
    assert one(db, "SELECT value FROM fencekit.meta WHERE key = 'core_version'") == str(
        sqlgen.CORE_VERSION
    )


def _state(conn: Conn) -> dict[str, Any]:
    """Everything an upgrade must leave alone: data, storage, fences."""
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
    }


def _still_fenced(conn: Conn, fence: int) -> None:
    reject(conn, STALE, fence - 1, "UPDATE up_row SET v = 'stale'")
    reject(conn, STALE, fence - 1, "INSERT INTO up_key VALUES (1, 'stale')")
    reject(conn, STALE, fence - 1, "INSERT INTO up_tab VALUES ('stale')")
    reject(conn, MISSING, None, "DELETE FROM up_row")
    reject(conn, MALFORMED, "1e3", "DELETE FROM up_key")


#: What release "2" adds to the core in the synthetic upgrade below.
SYNTHETIC_CORE = (
    "CREATE OR REPLACE FUNCTION fencekit.synthetic_release() RETURNS integer\n"
    "LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS 'SELECT 2'"
)
#: The first line of every trigger function that template "2" renders.
SYNTHETIC_MARK = "-- rendered by the synthetic template 2"


def _release_2(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's fencekit as if its next release were installed: core and template version
    2, a core with one more function, trigger functions with one more line. The versions are
    patched wherever a fencekit module holds them, so nothing keeps a copy of 1."""
    from fencekit.sqlgen import core
    from fencekit.sqlgen import protect as protect_module

    files = core._core_files()
    synthetic = [*files, ("99_synthetic.sql", SYNTHETIC_CORE)]
    monkeypatch.setattr(core, "_core_files", lambda: synthetic)
    for scope in ("statement_objects", "row_objects", "key_objects"):
        render = getattr(protect_module, scope)

        def marked(*args: Any, _render: Any = render, **kwargs: Any) -> Any:
            functions, triggers = _render(*args, **kwargs)
            return [replace(f, body=SYNTHETIC_MARK + "\n" + f.body) for f in functions], triggers

        monkeypatch.setattr(protect_module, scope, marked)
    for name, module in list(sys.modules.items()):
        if name == "fencekit" or name.startswith("fencekit."):
            for constant in ("CORE_VERSION", "TEMPLATE_VERSION"):
                if getattr(module, constant, None) == 1:
                    monkeypatch.setattr(module, constant, 2)


def _drift(conn: Conn) -> set[tuple[str, str]]:
    conn.rollback()
    found = {(d.kind.value, d.object) for d in catalog.status(conn).all_drift()}
    conn.rollback()
    return found


@pytest.mark.all_servers
def test_an_upgrade_to_a_synthetic_version_2_reports_drift_and_brings_everything_current(
    db: Conn, dsn: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The upgrade mechanism, generic: versions and stamps say what is older, status reports
    it, and `fencekit install` upgrades the core in place and re-protects the tables in the
    same transaction, keeping data, storage, fences and counters."""
    db.execute("CREATE TABLE up_row (id int PRIMARY KEY, v text)")
    db.execute("CREATE TABLE up_key (k int NOT NULL, v text)")
    db.execute("CREATE TABLE up_tab (v text)")
    db.commit()
    specs = [
        protect(db, "up_row"),
        protect(db, "up_key", "key", key=("k",)),
        protect(db, "up_tab", "table"),
    ]
    write(db, 10, "INSERT INTO up_row VALUES (1, 'a'), (2, 'b')")
    write(db, 10, "INSERT INTO up_key VALUES (1, 'a'), (2, 'b')")
    write(db, 10, "INSERT INTO up_tab VALUES ('a')")
    _still_fenced(db, 10)
    assert _drift(db) == set()
    before = _state(db)
    stale_before = rejection_count(db, "up_row", "stale")

    _release_2(monkeypatch)
    assert sqlgen.CORE_VERSION == sqlgen.TEMPLATE_VERSION == 2
    drift = _drift(db)
    assert ("core_outdated", "fencekit") in drift
    assert {kind for kind, subject in drift if subject.startswith("public.up_")} == {
        "template_outdated"
    }
    assert {subject for kind, subject in drift if kind == "template_outdated"} == {
        spec.table.dotted for spec in specs
    }
    _still_fenced(db, 10)  # the old objects keep fencing until the upgrade

    capsys.readouterr()
    assert main(["install", "--dsn", dsn]) == 0
    out = capsys.readouterr().out
    assert "upgraded fencekit core from version 1 to 2" in out
    assert out.count("re-protected public.up_") == 3
    assert one(db, "SELECT value FROM fencekit.meta WHERE key = 'core_version'") == "2"
    assert one(db, "SELECT fencekit.synthetic_release()") == 2
    assert rows(db, "SELECT DISTINCT template_version FROM fencekit.protected") == [(2,)]
    assert _drift(db) == set()
    assert _state(db) == before
    for spec in specs:
        objs = sqlgen.table_objects(spec)
        triggers = rows(
            db,
            "SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal "
            "ORDER BY 1",
            [spec.table.sql],
        )
        # The tables are not partitioned: none of the triggers of rows crossing partitions.
        assert [t for (t,) in triggers] == sorted(
            tr.name for tr in objs.triggers if not tr.partitioned_only
        )
        bodies = rows(
            db,
            "SELECT prosrc FROM pg_proc WHERE pronamespace = 'fencekit'::regnamespace "
            "AND left(proname, %s) = %s AND prorettype = 'trigger'::regtype",
            [len(objs.tag) + 1, objs.tag + "_"],
        )
        assert bodies
        assert all(src.startswith(SYNTHETIC_MARK) for (src,) in bodies)
    _still_fenced(db, 10)
    assert rejection_count(db, "up_row", "stale") == stale_before + 2  # counters survive
    write(db, 11, "UPDATE up_row SET v = 'release 2' WHERE id = 1")
    write(db, 11, "INSERT INTO up_key VALUES (1, 'release 2')")
    write(db, 11, "INSERT INTO up_tab VALUES ('release 2')")
    assert main(["install", "--dsn", dsn]) == 0  # again: nothing left to do
    assert "re-protected" not in capsys.readouterr().out
    _still_fenced(db, 11)


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
