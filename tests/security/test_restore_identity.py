"""Which table is the protected one: never a trigger's name alone, nor an oid a restore left.

A protected table is known by the oid protect recorded and by the triggers protect put on it.
Its owner may drop those triggers, rename the table away and give another table triggers named
like fencekit's (even one calling a row fence's TRUNCATE check, which the owner owns): status,
rename and protect must not take that table for the protected one. A restore (pg_dump,
pg_restore: run for real below, into a new database of the same server) gives every table and
function another oid and copies the registry's: status says so until protect records them
again, a fence column swapped meanwhile is seen by what still binds it by number, and the drop
of a table that gets the stale oid forgets nothing. An inheritance child's fence column is
recorded by number too, so stripping its other witnesses hides no swap."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from fencekit.catalog.drift import table_drift
from fencekit.catalog.model import Drift, DriftKind
from fencekit.catalog.registry import registered
from fencekit.embedded import EmbeddedServer
from fencekit.spec import FenceSpec, Scope, TableName
from fencekit.sqlgen import rename_statements
from tests import pg_binaries
from tests.security.conftest import Conn, attempt, protect, write_as

pytestmark = pytest.mark.all_servers

FENCE = 100
STALE = 5
OWNER = "r14_owner"


def _t(name: str) -> TableName:
    return TableName("public", name)


def _drift(db: Conn, name: str) -> list[Drift]:
    db.rollback()
    pt = registered(db, _t(name))
    assert pt is not None
    out = table_drift(db, pt)
    db.rollback()
    return out


def _kinds(db: Conn, name: str) -> list[str]:
    return [d.kind.value for d in _drift(db, name)]


def _tag(db: Conn, name: str) -> str:
    row = db.execute("SELECT tag FROM fencekit.protected WHERE table_name = %s", (name,)).fetchone()
    db.rollback()
    assert row is not None
    return str(row[0])


def _registered(db: Conn) -> list[str]:
    out = [str(r[0]) for r in db.execute("SELECT table_name FROM fencekit.protected ORDER BY 1")]
    db.rollback()
    return out


def _drop_triggers(conn: Conn, table: str) -> None:
    """The owner drops every trigger on its table."""
    for (name,) in conn.execute(
        "SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal",
        (table,),
    ).fetchall():
        conn.execute(f'DROP TRIGGER "{name}" ON {table}')


def _run_rename(db: Conn, old: str, new: str) -> None:
    pt = registered(db, _t(old))
    assert pt is not None
    for stmt in rename_statements(pt.spec, _t(new)):
        db.execute(stmt.encode())
    db.commit()


@pytest.fixture
def owner(db: Conn, make_role: Callable[..., str]) -> Iterator[Conn]:
    """The tables' owner: a role of its own that may create in schema public."""
    dsn = make_role(OWNER, "CREATE ON SCHEMA public")
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn


def _owned_table(db: Conn, owner: Conn, ddl: str, name: str) -> None:
    owner.execute(ddl)
    owner.execute(f"INSERT INTO {name} (id, v) VALUES (1, 'a'), (2, 'b')")
    db.rollback()


# ------------------------------------------------------------------ a trigger's name is no proof


def test_a_decoy_with_a_trigger_named_like_the_truncate_check_is_not_the_renamed_table(
    db: Conn, owner: Conn
) -> None:
    _owned_table(db, owner, "CREATE TABLE v (id int PRIMARY KEY, v text)", "v")
    spec = FenceSpec(_t("v"), scope=Scope.KEY, key=("id",))
    protect(db, spec)
    db.commit()
    write_as(db, FENCE, "UPDATE v SET v = 'tok100' WHERE id = 1")
    tag = _tag(db, "v")
    # The owner strips its table, hides it under another name and dresses up a decoy.
    _drop_triggers(owner, "v")
    owner.execute("ALTER TABLE v RENAME TO v_hidden")
    owner.execute(
        "CREATE TABLE decoy (id int PRIMARY KEY, v text);"
        "CREATE FUNCTION noop() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NULL; END$$;"
        f"CREATE TRIGGER fencekit_{tag}_trunc BEFORE TRUNCATE ON decoy "
        "FOR EACH STATEMENT EXECUTE FUNCTION noop()"
    )
    drift = _drift(db, "v")
    assert drift[0].kind is DriftKind.TABLE_RENAMED
    assert drift[0].command is not None
    assert drift[0].command.new_name == _t("v_hidden"), drift[0].message
    assert DriftKind.TRIGGER_MISSING in {d.kind for d in drift}
    # The protection cannot be moved onto the decoy.
    with pytest.raises(psycopg.Error) as e:
        _run_rename(db, "v", "decoy")
    db.rollback()
    assert e.value.sqlstate == "YF000", str(e.value)
    assert "public.v_hidden" in str(e.value)
    assert _registered(db) == ["v"]
    # Status's fixes put the protection back on the table it protected.
    _run_rename(db, "v", "v_hidden")
    assert _kinds(db, "v_hidden") == []
    attempt(db, "YF001", "UPDATE v_hidden SET v = 'stale' WHERE id = 1", token=STALE)
    attempt(db, ("YF002", "YF003"), "UPDATE v_hidden SET v = 'none' WHERE id = 1")


@pytest.mark.parametrize("scope", [Scope.KEY, Scope.ROW])
def test_a_decoy_under_the_registered_name_is_not_protected_in_its_place(
    db: Conn, owner: Conn, scope: Scope
) -> None:
    _owned_table(db, owner, "CREATE TABLE w (id int PRIMARY KEY, v text)", "w")
    spec = FenceSpec(_t("w"), scope=scope, key=("id",) if scope is Scope.KEY else ())
    protect(db, spec)
    db.commit()
    write_as(db, FENCE, "UPDATE w SET v = 'tok100' WHERE id = 1")
    tag = _tag(db, "w")
    _drop_triggers(owner, "w")
    owner.execute("ALTER TABLE w RENAME TO w_real")
    # A row fence's TRUNCATE check belongs to the table's owner, which may attach it anywhere;
    # on a key fence the decoy's trigger only has the name.
    owner.execute(
        "CREATE TABLE w (id int PRIMARY KEY, v text"
        + (", fencekit_fence bigint)" if scope is Scope.ROW else ")")
    )
    if scope is Scope.ROW:
        function = f"fencekit.{tag}_trunc"
    else:
        owner.execute(
            "CREATE FUNCTION noop() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NULL; END$$"
        )
        function = "noop"
    owner.execute(
        f"CREATE TRIGGER fencekit_{tag}_trunc BEFORE TRUNCATE ON w "
        f"FOR EACH STATEMENT EXECUTE FUNCTION {function}()"
    )
    drift = _drift(db, "w")
    assert drift[0].kind is DriftKind.TABLE_RENAMED, [d.kind for d in drift]
    assert drift[0].command is not None
    assert drift[0].command.new_name == _t("w_real")
    assert "public.w is now another table" in drift[0].message
    # Protect refuses the decoy: it would re-bind the registry row to it.
    with pytest.raises(psycopg.Error) as e:
        protect(db, spec)
    db.rollback()
    assert e.value.sqlstate == "YF000"
    assert "is not the table protected under that name" in str(e.value)
    assert "public.w_real" in str(e.value)
    # Dropping the decoy forgets nothing; with the real table back under its name, protect
    # restores its fence.
    owner.execute("DROP TABLE w")
    assert _registered(db) == ["w"]
    owner.execute("ALTER TABLE w_real RENAME TO w")
    assert DriftKind.TRIGGER_MISSING.value in _kinds(db, "w")
    protect(db, spec)
    db.commit()
    assert _kinds(db, "w") == []
    attempt(db, "YF001", "UPDATE w SET v = 'stale' WHERE id = 1", token=STALE)


def test_a_claim_on_a_decoy_under_the_registered_name_is_refused(db: Conn, owner: Conn) -> None:
    """Its writers would raise the protected table's fences (a claim needs only a write right
    on the table it names)."""
    _owned_table(db, owner, "CREATE TABLE tc (id int PRIMARY KEY, v text)", "tc")
    protect(db, FenceSpec(_t("tc"), scope=Scope.TABLE))
    db.commit()
    write_as(db, FENCE, "UPDATE tc SET v = 'tok100' WHERE id = 1")
    _drop_triggers(owner, "tc")
    owner.execute("ALTER TABLE tc RENAME TO tc_real; CREATE TABLE tc (id int, v text)")
    attempt(db, "YF000", "SELECT fencekit.claim('tc', NULL::text[], 500)")
    row = db.execute("SELECT fencekit.current_fence('public.tc', '')").fetchone()
    db.rollback()
    assert row == (FENCE,)


# ------------------------------------------------------------------ after a restore


@pytest.fixture
def restore(
    db: Conn, dsn: str, target_server: EmbeddedServer, tmp_path: Path, owner: Conn
) -> Iterator[Callable[[], Conn]]:
    """``restore()``: pg_dump the test database and pg_restore it into a new database of the
    same server (as a DBA moves a database), with the server major's pinned tools; a
    connection to the copy. Dropped before the owner role is."""
    major = target_server.server_version_num // 10000
    try:
        bindir = pg_binaries.ensure(major)
    except pg_binaries.BinariesUnavailable as exc:  # pragma: no cover - the cache is provisioned
        pytest.fail(f"pg_dump/pg_restore of PostgreSQL {major}: {exc}")
    target = f"{conninfo_to_dict(dsn)['dbname']}_restored"
    target_dsn = make_conninfo(dsn, dbname=target)
    opened: list[Conn] = []

    def _restore() -> Conn:
        db.rollback()
        dump = tmp_path / "db.dump"
        _tool([str(bindir / "pg_dump"), "-Fc", "-f", str(dump), "-d", dsn])
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{target}" TEMPLATE template0')
        _tool([str(bindir / "pg_restore"), "--exit-on-error", "-d", target_dsn, str(dump)])
        conn = psycopg.connect(target_dsn)
        opened.append(conn)
        return conn

    yield _restore
    for conn in opened:
        conn.close()
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{target}" WITH (FORCE)')


def _tool(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)  # noqa: S603
    assert proc.returncode == 0, f"{cmd[0]}: {proc.stderr[-3000:]}"


def _as_owner(restored: Conn, *statements: str) -> None:
    """Run ``statements`` as the tables' owner in the restored database."""
    restored.rollback()
    restored.execute(f"SET ROLE {OWNER}")
    for stmt in statements:
        restored.execute(stmt)
    restored.execute("RESET ROLE")
    restored.commit()


def _oids_hold(conn: Conn, name: str) -> bool:
    row = conn.execute(
        "SELECT fencekit.recorded_oids_hold(tag) FROM fencekit.protected WHERE table_name = %s",
        (name,),
    ).fetchone()
    conn.rollback()
    assert row is not None
    return bool(row[0])


def test_after_a_restore_status_says_the_recorded_oids_are_stale_until_protect(
    db: Conn, owner: Conn, restore: Callable[[], Conn]
) -> None:
    _owned_table(db, owner, "CREATE TABLE rs (id int PRIMARY KEY, v text)", "rs")
    _owned_table(db, owner, "CREATE TABLE ks (id int PRIMARY KEY, v text)", "ks")
    specs = [FenceSpec(_t("rs")), FenceSpec(_t("ks"), scope=Scope.KEY, key=("id",))]
    for spec in specs:
        protect(db, spec)
    db.commit()
    assert _kinds(db, "rs") == []
    assert _kinds(db, "ks") == []
    restored = restore()
    for name in ("rs", "ks"):
        assert not _oids_hold(restored, name)
        assert _kinds(restored, name) == [DriftKind.TABLE_OID_STALE.value]
    for spec in specs:
        protect(restored, spec)
    restored.commit()
    for name in ("rs", "ks"):
        assert _oids_hold(restored, name)
        assert _kinds(restored, name) == []


def test_a_fence_column_swapped_after_a_restore_is_seen_and_protect_refuses(
    db: Conn, owner: Conn, restore: Callable[[], Conn]
) -> None:
    _owned_table(db, owner, "CREATE TABLE rs (id int PRIMARY KEY, v text)", "rs")
    spec = FenceSpec(_t("rs"))
    protect(db, spec)
    db.commit()
    write_as(db, FENCE, "UPDATE rs SET v = 'tok100' WHERE id = 1")
    restored = restore()
    _as_owner(
        restored,
        "ALTER TABLE rs RENAME fencekit_fence TO ff_old",
        "ALTER TABLE rs ADD COLUMN fencekit_fence bigint",
    )
    drift = _drift(restored, "rs")
    swapped = [d for d in drift if d.kind is DriftKind.FENCE_COLUMN_SWAPPED]
    assert len(swapped) == 1, [d.kind for d in drift]
    assert "ff_old" in swapped[0].message
    assert DriftKind.TABLE_OID_STALE in {d.kind for d in drift}
    with pytest.raises(psycopg.Error) as e:
        protect(restored, spec)
    restored.rollback()
    assert e.value.sqlstate == "YF000"
    assert "ff_old" in str(e.value)
    # The fix status prints (the columns renamed back) lets protect record the table anew.
    _as_owner(
        restored,
        "ALTER TABLE rs RENAME fencekit_fence TO spare",
        "ALTER TABLE rs RENAME ff_old TO fencekit_fence",
    )
    protect(restored, spec)
    restored.commit()
    attempt(restored, "YF001", "UPDATE rs SET v = 'stale' WHERE id = 1", token=STALE)


@pytest.mark.parametrize("added", [True, False])
def test_a_key_column_swapped_after_a_restore_is_seen_and_protect_refuses(
    db: Conn, owner: Conn, restore: Callable[[], Conn], added: bool
) -> None:
    """A key fence's ``_keys`` trigger names its key columns by number, which a restore keeps."""
    _owned_table(db, owner, "CREATE TABLE kr (id int PRIMARY KEY, v text)", "kr")
    spec = FenceSpec(_t("kr"), scope=Scope.KEY, key=("id",))
    protect(db, spec)
    db.commit()
    write_as(db, FENCE, "UPDATE kr SET v = 'tok100' WHERE id = 1")
    restored = restore()
    swap = ["ALTER TABLE kr RENAME id TO id_old"]
    if added:
        swap.append("ALTER TABLE kr ADD COLUMN id int NOT NULL DEFAULT 1001")
    _as_owner(restored, *swap)
    drift = _drift(restored, "kr")
    swapped = [d for d in drift if d.kind is DriftKind.KEY_COLUMN_SWAPPED]
    assert len(swapped) == 1, [d.kind for d in drift]
    assert "id_old" in swapped[0].message
    with pytest.raises(psycopg.Error) as e:
        protect(restored, spec)
    restored.rollback()
    assert e.value.sqlstate == "YF000"
    assert "id_old" in str(e.value)
    if added:
        _as_owner(restored, "ALTER TABLE kr RENAME id TO spare")
    _as_owner(restored, "ALTER TABLE kr RENAME id_old TO id")
    protect(restored, spec)
    restored.commit()
    attempt(restored, "YF001", "UPDATE kr SET v = 'stale' WHERE id = 1", token=STALE)


def test_after_a_restore_a_table_without_the_triggers_is_not_protected_in_its_place(
    db: Conn, owner: Conn, restore: Callable[[], Conn]
) -> None:
    """Restored, the registry's oid no longer names the table; the owner strips the restored
    table, hides it and puts another under its name: nothing proves which is the protected one,
    so protect refuses rather than move the protection onto the other."""
    _owned_table(db, owner, "CREATE TABLE rd (id int PRIMARY KEY, v text)", "rd")
    spec = FenceSpec(_t("rd"), scope=Scope.KEY, key=("id",))
    protect(db, spec)
    db.commit()
    write_as(db, FENCE, "UPDATE rd SET v = 'tok100' WHERE id = 1")
    restored = restore()
    _as_owner(
        restored,
        *_trigger_drops(restored, "rd"),
        "ALTER TABLE rd RENAME TO rd_hidden",
        "CREATE TABLE rd (id int PRIMARY KEY, v text)",
    )
    with pytest.raises(psycopg.Error) as e:
        protect(restored, spec)
    restored.rollback()
    assert e.value.sqlstate == "YF000"
    assert "carries none of the triggers" in str(e.value)
    stale = [d for d in _drift(restored, "rd") if d.kind is DriftKind.TABLE_OID_STALE]
    assert len(stale) == 1
    assert "nothing tells that it is the protected table" in stale[0].message


def test_the_drop_of_a_table_that_gets_a_stale_oid_forgets_nothing(
    db: Conn, owner: Conn, restore: Callable[[], Conn]
) -> None:
    _owned_table(db, owner, "CREATE TABLE fo (id int PRIMARY KEY, v text)", "fo")
    protect(db, FenceSpec(_t("fo"), scope=Scope.KEY, key=("id",)))
    db.commit()
    write_as(db, FENCE, "UPDATE fo SET v = 'tok100' WHERE id = 1")
    restored = restore()
    # Restored into a fresh cluster, the registry's stale oid may lie ahead of the oid counter,
    # and the owner can create tables until one of its own gets it (oids are handed out in
    # order). Here the restore was into the same cluster, whose counter is past the stale oid:
    # the owner's table gets an oid of its own, and the registry row is given it, which is
    # the same state.
    _as_owner(restored, "CREATE TABLE burn ()")
    restored.execute(
        "UPDATE fencekit.protected SET table_oid = 'burn'::regclass WHERE table_name = 'fo'"
    )
    restored.commit()
    _as_owner(restored, *_trigger_drops(restored, "fo"), "DROP TABLE burn")
    assert _registered(restored) == ["fo"]
    kinds = _kinds(restored, "fo")
    assert DriftKind.TABLE_OID_STALE.value in kinds
    assert DriftKind.TRIGGER_MISSING.value in kinds


def test_oids_steered_into_place_in_another_cluster_do_not_hold(
    db: Conn, owner: Conn, restore: Callable[[], Conn]
) -> None:
    """Restored into a fresh cluster, the oids are handed out in the dump's order: the owner
    can pad the dump with functions and tables of its own until the restored <tag>_stmt gets
    the recorded function_oid and a decoy of its own the recorded table_oid. The oids count
    only in the cluster that recorded them. Simulated here (the restore is into the same
    cluster): the registry is given the oids the owner would have steered, and the cluster
    identifier of the cluster it came from, which a fresh initdb never repeats."""
    _owned_table(db, owner, "CREATE TABLE so (id int PRIMARY KEY, v text)", "so")
    protect(db, FenceSpec(_t("so"), scope=Scope.KEY, key=("id",)))
    db.commit()
    write_as(db, FENCE, "UPDATE so SET v = 'tok100' WHERE id = 1")
    restored = restore()
    _as_owner(restored, "CREATE TABLE decoy (id int PRIMARY KEY, v text)")
    restored.execute(
        "UPDATE fencekit.protected p SET table_oid = 'decoy'::regclass,"
        " function_oid = pg_catalog.to_regprocedure(format('fencekit.%I()', p.tag || '_stmt')),"
        " cluster_id = p.cluster_id # 1 WHERE table_name = 'so'"
    )
    restored.commit()
    assert not _oids_hold(restored, "so")
    assert DriftKind.TABLE_OID_STALE.value in _kinds(restored, "so")
    _as_owner(restored, "DROP TABLE decoy")
    assert _registered(restored) == ["so"]


def _trigger_drops(conn: Conn, table: str) -> list[str]:
    rows = conn.execute(
        "SELECT format('DROP TRIGGER %%I ON %%s', tgname, tgrelid::regclass) FROM pg_trigger "
        "WHERE tgrelid = %s::regclass AND NOT tgisinternal",
        (table,),
    ).fetchall()
    conn.rollback()
    return [str(r[0]) for r in rows]


def test_dropping_the_protected_table_itself_still_forgets_it(db: Conn, owner: Conn) -> None:
    _owned_table(db, owner, "CREATE TABLE gone (id int PRIMARY KEY, v text)", "gone")
    protect(db, FenceSpec(_t("gone")))
    db.commit()
    owner.execute("DROP TABLE gone")
    assert _registered(db) == []


# ------------------------------------------------------------------ inheritance children


def test_a_child_swapped_and_stripped_of_its_default_is_seen(db: Conn, owner: Conn) -> None:
    owner.execute(
        "CREATE TABLE q (id int PRIMARY KEY, v text);"
        "CREATE TABLE qc (id int, v text) INHERITS (q);"
        "INSERT INTO qc VALUES (1, 'a')"
    )
    spec = FenceSpec(_t("q"))
    protect(db, spec)
    db.commit()
    write_as(db, FENCE, "UPDATE q SET v = 'tok100' WHERE id = 1")
    tag = _tag(db, "q")
    owner.execute(
        "ALTER TABLE qc NO INHERIT q;"
        "ALTER TABLE qc RENAME fencekit_fence TO ff_old;"
        "ALTER TABLE qc ALTER COLUMN ff_old DROP DEFAULT;"
        "ALTER TABLE qc ADD COLUMN fencekit_fence bigint;"
        "ALTER TABLE qc INHERIT q;"
        f"DROP TRIGGER fencekit_{tag}_ins ON qc"
    )
    drift = _drift(db, "q")
    swapped = [d for d in drift if d.kind is DriftKind.FENCE_COLUMN_SWAPPED]
    assert len(swapped) == 1, [d.kind for d in drift]
    assert "qc" in swapped[0].object
    assert "ff_old" in swapped[0].message
    with pytest.raises(psycopg.Error) as e:
        protect(db, spec)
    db.rollback()
    assert e.value.sqlstate == "YF000"
    assert "ff_old" in str(e.value)
