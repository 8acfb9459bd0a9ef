"""A protected table's owner cannot take it out of fencekit's sight by its place in an
inheritance tree or by renaming it.

A key or table fence's checks are statement triggers, which PostgreSQL fires only for
statements naming the table: a statement naming a parent writes the child's rows judged by the
parent's fence at most, so protect refuses such a fence on a child, and status (and the enforce
gate, which reuses its code) reports one that became a child, whatever the parent. A renamed
protected table is still checked: status runs every check on it by oid, auto-cover refuses a new
partition of it until the protection follows the rename, and the drop of another table under its
old name forgets nothing, even with the table's triggers gone."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest

from fencekit.catalog.drift import table_drift
from fencekit.catalog.model import DriftKind
from fencekit.catalog.registry import registered
from fencekit.catalog.rollout import enforce_refusal, unseen_paths
from fencekit.spec import FenceSpec, Scope, TableName
from tests.security.conftest import Conn, protect

FENCE = 100


def _t(name: str) -> TableName:
    return TableName("public", name)


def _kinds(db: Conn, name: str) -> list[str]:
    pt = registered(db, _t(name))
    assert pt is not None
    return [d.kind.value for d in table_drift(db, pt)]


def _write(db: Conn, token: int | None, stmt: str) -> None:
    if token is not None:
        db.execute("SELECT set_config('fencekit.token', %s, true)", (str(token),))
    db.execute(stmt)
    db.commit()


def _tag(db: Conn, name: str) -> str:
    row = db.execute("SELECT tag FROM fencekit.protected WHERE table_name = %s", (name,)).fetchone()
    assert row is not None
    return str(row[0])


# ------------------------------------------------------------------ statement fences as children


def test_a_table_fenced_child_of_a_protected_table_is_reported_and_gated(db: Conn) -> None:
    # (A key-fenced table cannot become a child: PostgreSQL refuses INHERIT to a table with
    # transition-table triggers; protect refuses it on one that already is, below.)
    db.execute(
        "CREATE TABLE a (id int NOT NULL, k int NOT NULL, v text);"
        "CREATE TABLE tf (id int NOT NULL, k int NOT NULL, v text)"
    )
    parent = FenceSpec(_t("a"), scope=Scope.TABLE, on_missing="allow")
    # In rollout (tokenless writes allowed, counted): the enforce gate must refuse.
    child = FenceSpec(_t("tf"), scope=Scope.TABLE, on_missing="allow")
    protect(db, parent)
    protect(db, child)
    db.commit()
    _write(db, FENCE, "INSERT INTO tf VALUES (1, 1, 'fenced')")
    # The owner drops the root guard (its trigger, on its table) and makes tf a child of a.
    db.execute(f"DROP TRIGGER fencekit_{_tag(db, 'tf')}_root ON tf")
    db.execute("ALTER TABLE tf INHERIT a")
    protect(db, parent)  # status's fix for a's new child: covers it with a's triggers
    db.commit()
    assert _kinds(db, "tf") == [DriftKind.PROTECTED_ANCESTOR.value]
    assert [d.kind for d in unseen_paths(db, child)] == [DriftKind.PROTECTED_ANCESTOR]
    refusal = enforce_refusal(db, _t("tf"), timedelta(seconds=1))
    assert refusal is not None
    assert "protected with its own fence" in refusal
    # What status reports: a statement naming a writes tf's rows past tf's fence.
    _write(db, 5, "UPDATE a SET v = 'stale via a' WHERE id = 1")
    with pytest.raises(psycopg.Error) as e:
        _write(db, 5, "UPDATE tf SET v = 'stale' WHERE id = 1")
    db.rollback()
    assert e.value.sqlstate == "YF001"
    # Re-protecting tf now refuses: it inherits from a.
    with pytest.raises(psycopg.Error) as e:
        protect(db, child)
    db.rollback()
    assert e.value.sqlstate == "YF000"
    assert "inherits from" in str(e.value)


@pytest.mark.parametrize("scope", [Scope.KEY, Scope.TABLE])
@pytest.mark.parametrize("parent_protected", [True, False])
def test_protect_refuses_a_statement_fence_on_an_inheritance_child(
    db: Conn, scope: Scope, parent_protected: bool
) -> None:
    db.execute(
        "CREATE TABLE a (id int NOT NULL, k int NOT NULL, v text);CREATE TABLE t2 () INHERITS (a)"
    )
    if parent_protected:
        protect(db, FenceSpec(_t("a"), scope=Scope.TABLE, on_missing="allow"))
    db.commit()
    spec = FenceSpec(_t("t2"), scope=scope, key=("k",) if scope is Scope.KEY else ())
    with pytest.raises(psycopg.Error) as e:
        protect(db, spec)
    db.rollback()
    assert e.value.sqlstate == "YF000"
    assert "NO INHERIT" in (e.value.diag.message_hint or "")
    assert registered(db, _t("t2")) is None
    # A row fence's checks fire on the child's rows whatever the statement names.
    protect(db, FenceSpec(_t("t2")))
    db.commit()
    assert registered(db, _t("t2")) is not None


# ------------------------------------------------------------------ renamed tables


def test_status_checks_a_renamed_table_by_oid(db: Conn) -> None:
    db.execute("CREATE TABLE d (id int PRIMARY KEY, v text)")
    protect(db, FenceSpec(_t("d")))
    db.commit()
    tag = _tag(db, "d")
    db.execute(f"ALTER TABLE d DISABLE TRIGGER fencekit_{tag}_upd")
    # The owner's statement trigger that sorts first and sets the token.
    db.execute(
        "CREATE FUNCTION evil() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN "
        "PERFORM set_config('fencekit.token', '999999', true); RETURN NULL; END$$;"
        "CREATE TRIGGER a0 BEFORE UPDATE ON d FOR EACH STATEMENT EXECUTE FUNCTION evil()"
    )
    db.execute("ALTER TABLE d RENAME TO d2")
    db.commit()
    pt = registered(db, _t("d"))
    assert pt is not None
    drift = table_drift(db, pt)
    kinds = [d.kind for d in drift]
    assert kinds[0] is DriftKind.TABLE_RENAMED
    assert DriftKind.TRIGGER_DISABLED in kinds
    assert any(d.kind.value.startswith("foreign_trigger") and "a0" in d.message for d in drift)
    assert "still check" not in drift[0].message
    disabled = next(d for d in drift if d.kind is DriftKind.TRIGGER_DISABLED)
    assert "public.d2" in disabled.fix
    # Even with its TRUNCATE trigger dropped, the table is found by the oid protect recorded.
    db.execute(f"DROP TRIGGER fencekit_{tag}_trunc ON d2")
    db.commit()
    kinds = [d.kind for d in table_drift(db, pt)]
    assert kinds[0] is DriftKind.TABLE_RENAMED
    assert {DriftKind.TRIGGER_DISABLED, DriftKind.TRIGGER_MISSING} <= set(kinds)


@pytest.fixture
def auto_cover(db: Conn) -> Conn:
    db.execute("SELECT fencekit.set_auto_cover(true)")
    db.commit()
    return db


def test_auto_cover_refuses_a_new_partition_of_a_renamed_table(auto_cover: Conn) -> None:
    db = auto_cover
    db.execute(
        "CREATE TABLE kp (id int NOT NULL, v text) PARTITION BY RANGE (id);"
        "CREATE TABLE kp1 PARTITION OF kp FOR VALUES FROM (0) TO (100)"
    )
    protect(db, FenceSpec(_t("kp"), scope=Scope.TABLE))
    db.commit()
    _write(db, FENCE, "INSERT INTO kp VALUES (1, 'fenced')")
    db.execute("ALTER TABLE kp RENAME TO kp_r")
    db.commit()
    with pytest.raises(psycopg.Error) as e:
        db.execute("CREATE TABLE kp2 PARTITION OF kp_r FOR VALUES FROM (100) TO (200)")
    db.rollback()
    assert e.value.sqlstate == "YF000"
    assert "fencekit rename" in (e.value.diag.message_hint or "")
    assert db.execute("SELECT to_regclass('kp2')").fetchone() == (None,)
    # Renamed back, the same partition is covered and fenced.
    db.execute("ALTER TABLE kp_r RENAME TO kp")
    db.execute("CREATE TABLE kp2 PARTITION OF kp FOR VALUES FROM (100) TO (200)")
    db.commit()
    with pytest.raises(psycopg.Error) as e:
        _write(db, 5, "INSERT INTO kp2 VALUES (151, 'stale')")
    db.rollback()
    assert e.value.sqlstate == "YF001"


def test_auto_cover_refuses_a_foreign_partition_of_a_renamed_table(auto_cover: Conn) -> None:
    db = auto_cover
    db.execute(
        "CREATE FOREIGN DATA WRAPPER anc_none; CREATE SERVER anc_srv FOREIGN DATA WRAPPER anc_none;"
        "CREATE TABLE fp (id int NOT NULL, v text) PARTITION BY RANGE (id);"
        "CREATE TABLE fp1 PARTITION OF fp FOR VALUES FROM (0) TO (100)"
    )
    protect(db, FenceSpec(_t("fp"), scope=Scope.TABLE))
    db.execute("ALTER TABLE fp RENAME TO fp_r")
    db.commit()
    with pytest.raises(psycopg.Error) as e:
        db.execute(
            "CREATE FOREIGN TABLE fp2 PARTITION OF fp_r FOR VALUES FROM (100) TO (200) "
            "SERVER anc_srv"
        )
    db.rollback()
    assert e.value.sqlstate == "YF000"
    assert "foreign table" in str(e.value)


# ------------------------------------------------------------------ dropped tables


def test_dropping_a_decoy_under_a_protected_tables_name_forgets_nothing(db: Conn) -> None:
    db.execute("CREATE TABLE v (id int PRIMARY KEY, k int NOT NULL, v text)")
    protect(db, FenceSpec(_t("v"), scope=Scope.KEY, key=("id",)))
    db.commit()
    _write(db, FENCE, "INSERT INTO v VALUES (1, 1, 'fenced')")
    # The owner drops its table's triggers, renames it, creates and drops a decoy under its
    # name, and renames it back.
    for (name,) in db.execute(
        "SELECT tgname FROM pg_trigger WHERE tgrelid = 'v'::regclass AND NOT tgisinternal"
    ).fetchall():
        db.execute(f'DROP TRIGGER "{name}" ON v')
    db.execute("ALTER TABLE v RENAME TO v_tmp; CREATE TABLE v (); DROP TABLE v")
    db.execute("ALTER TABLE v_tmp RENAME TO v")
    db.commit()
    pt = registered(db, _t("v"))
    assert pt is not None  # still protected: status reports the missing triggers
    assert DriftKind.TRIGGER_MISSING in {d.kind for d in table_drift(db, pt)}
    assert db.execute(
        "SELECT count(*) FROM fencekit.fences WHERE resource = 'public.v'"
    ).fetchone() == (1,)


def test_a_protected_table_dropped_under_a_new_name_is_forgotten(db: Conn) -> None:
    db.execute("CREATE TABLE w (id int PRIMARY KEY)")
    protect(db, FenceSpec(_t("w")))
    db.execute("ALTER TABLE w RENAME TO w2")
    db.commit()
    db.execute("DROP TABLE w2")
    db.commit()
    assert registered(db, _t("w")) is None


def test_a_shared_key_fence_is_checked_against_a_renamed_sharer(db: Conn) -> None:
    db.execute(
        "CREATE TABLE ka (id int PRIMARY KEY, k int NOT NULL);"
        "CREATE TABLE kb (id int PRIMARY KEY, k numeric(10, 2) NOT NULL)"
    )
    protect(db, FenceSpec(_t("ka"), scope=Scope.KEY, key=("k",), resource="shared"))
    db.execute("ALTER TABLE ka RENAME TO ka2")
    db.commit()
    # 1 and 1.00 name one key differently: sharing the resource would split its fences.
    with pytest.raises(psycopg.Error) as e:
        protect(db, FenceSpec(_t("kb"), scope=Scope.KEY, key=("k",), resource="shared"))
    db.rollback()
    assert e.value.sqlstate == "YF000"
    assert "public.ka" in str(e.value)
