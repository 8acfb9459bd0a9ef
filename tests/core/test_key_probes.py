"""A key fence looks its keys up by index, one probe per key, never by scanning the fences.

``fencekit.judge_fences`` is called with ``TG_NAME`` (a ``name``, collation "C"): unless it
compares under the default collation, the one ``fencekit.fences``' primary key was built with,
the planner cannot use the index and every key scans the whole table (a 10,000-row INSERT over
1,000 keys took 1.7 s instead of 0.1 s). Counted with ``pg_stat_xact_user_tables`` (this
transaction's own scans), so nothing here depends on time.
"""

from __future__ import annotations

import pytest

from tests.core.helpers import Conn, protect, write


@pytest.mark.parametrize("token", [11, 10], ids=["new token", "same token"])
def test_key_fence_probes_fences_by_index(db: Conn, token: int) -> None:
    db.execute("CREATE TABLE k (id bigint PRIMARY KEY, account_id bigint NOT NULL, v int)")
    db.commit()
    protect(db, "k", "key", key=("account_id",))
    write(db, 10, "INSERT INTO k SELECT g, g % 1000, 0 FROM generate_series(1, 5000) g")
    db.execute("ANALYZE fencekit.fences")
    db.commit()
    db.execute("SELECT set_config('fencekit.token', %s, true)", (str(token),))
    db.execute("INSERT INTO k SELECT g, g % 1000, 0 FROM generate_series(5001, 10000) g")
    row = db.execute(
        "SELECT seq_scan, idx_scan FROM pg_stat_xact_user_tables "
        "WHERE relid = 'fencekit.fences'::regclass"
    ).fetchone()
    db.rollback()
    assert row is not None
    seq, idx = row
    assert seq == 0, f"fencekit.fences scanned {seq} times (index probes: {idx})"
    assert idx >= 1000


def test_a_one_key_write_probes_by_index_after_the_fences_grew(db: Conn) -> None:
    """The trigger's plans are cached from its first statements: here while fencekit.fences
    was empty and analysed so (a scan of it looked cheapest), then it grows to 3,000 fences
    without another ANALYZE. A one-row write must still probe the one fence by its index."""
    db.execute("CREATE TABLE k (id bigint PRIMARY KEY, account_id bigint NOT NULL, v int)")
    db.execute("INSERT INTO k SELECT g, g, 0 FROM generate_series(1, 3000) g")
    db.commit()
    protect(db, "k", "key", key=("account_id",))
    db.execute("ANALYZE fencekit.fences")
    db.commit()
    for i in range(1, 11):  # the same session: past the plan cache's five custom plans
        write(db, 10 + i, f"UPDATE k SET v = v + 1 WHERE id = {i}")
        write(db, 10 + i, f"UPDATE k SET v = v + 1 WHERE id = {i}")
    write(db, 30, "UPDATE k SET v = v + 1")  # 3,000 fences now
    for token in (31, 31):  # a new token (the upsert), then the same one (the share lock)
        db.execute("SELECT set_config('fencekit.token', %s, true)", (str(token),))
        db.execute("UPDATE k SET v = v + 1 WHERE id = 7")
        row = db.execute(
            "SELECT seq_scan, idx_scan FROM pg_stat_xact_user_tables "
            "WHERE relid = 'fencekit.fences'::regclass"
        ).fetchone()
        db.commit()
        assert row is not None
        assert row[0] == 0, f"fencekit.fences scanned whole {row[0]} times (probes: {row[1]})"


# Every type a key column may have, and a few a fast check must not name.
KEY_COLUMN_TYPES = (
    "smallint", "integer", "bigint", "text", "varchar(10)", "char(3)", 'text COLLATE "C"',
    'text COLLATE "POSIX"', "numeric(10,2)", "numeric(5,0)", "uuid", "boolean", "date", "time",
    "timestamp", "timestamptz", "bytea", "varchar", "varchar(2)", "char(10)", "time(0)",
    "timestamp(3)", "timestamptz(0)", "timestamp(6)", "time(6)",
)  # fmt: skip


def test_the_triggers_type_check_names_families_as_key_family_does(db: Conn) -> None:
    """The key triggers name each key column's family themselves (no call per statement); a
    family they named differently from fencekit.key_family, which protect recorded, would
    send every statement to the slow check."""
    from fencekit.sqlgen.key import _family

    cols = ", ".join(f"c{i} {t}" for i, t in enumerate(KEY_COLUMN_TYPES))
    db.execute(f"CREATE TABLE kt ({cols}, f float8, n numeric, j jsonb)")
    got = db.execute(
        f"SELECT a.attname, {_family('a')} FROM pg_attribute a "
        "WHERE a.attrelid = 'kt'::regclass AND a.attnum > 0 ORDER BY a.attnum"
    ).fetchall()
    for name, fast in got:
        if name in ("f", "n", "j"):
            assert fast is None, name  # refused by key_family: never named here
            continue
        slow = db.execute("SELECT fencekit.key_family('kt'::regclass, %s)", (name,)).fetchone()
        assert slow is not None
        assert fast == slow[0], name
