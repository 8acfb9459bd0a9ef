"""``fencekit sql install|protect|unprotect --no-transaction``: the same statements with no
BEGIN/COMMIT and no lock_timeout, run inside a transaction the caller opened (a Django
``RunSQL``, a migration tool's own), which then decides whether they happen."""

from __future__ import annotations

from typing import Any

import psycopg

from .conftest import Cli


def _protected(conn: psycopg.Connection[Any]) -> list[str]:
    rows = conn.execute("SELECT table_name FROM fencekit.protected ORDER BY 1").fetchall()
    return [r[0] for r in rows]


def test_scripts_without_their_own_transaction(cli: Cli, db: psycopg.Connection[Any]) -> None:
    db.execute("CREATE TABLE ledger (account_id int, total int)")
    db.commit()
    protect = cli("sql", "protect", "ledger", "--key", "account_id", "--no-transaction")
    unprotect = cli("sql", "unprotect", "ledger", "--key", "account_id", "--no-transaction")
    install = cli("sql", "install", "--no-transaction")
    for result in (protect, unprotect, install):
        assert result.code == 0, result.err
        lines = {line.strip().upper() for line in result.out.splitlines()}
        assert not lines & {"BEGIN;", "COMMIT;", "ROLLBACK;"}
        assert "LOCK_TIMEOUT =" not in result.out.upper()
    # Inside the caller's transaction: rolled back with it, committed with it.
    db.execute(protect.out.encode())
    assert _protected(db) == ["ledger"]
    db.rollback()
    assert _protected(db) == []
    db.execute(protect.out.encode())
    db.commit()
    assert _protected(db) == ["ledger"]
    db.execute(install.out.encode())  # idempotent, also inside a transaction
    db.execute(unprotect.out.encode())
    db.commit()
    assert _protected(db) == []


def test_the_default_scripts_keep_their_transaction(cli: Cli) -> None:
    out = cli("sql", "protect", "ledger").out
    assert "\nBEGIN;\nSET LOCAL lock_timeout = '5s';\n" in out
    assert out.endswith("COMMIT;\n")
