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
