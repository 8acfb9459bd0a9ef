"""Rename a protected table: after ``ALTER TABLE ... RENAME`` the old
triggers keep rejecting stale writes, ``status`` names the one command that fixes it, and
``fencekit rename`` moves the protection to the new name in one transaction: exactly one set of
fencekit triggers remains, named after the new name, and fences and counters follow."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fencekit.ident import object_tag

from .conftest import Cli
from .test_unprotect_exact import _one, _psql, _run, _write


def _fencekit_triggers(dsn: str, table: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal "
            "AND tgname LIKE 'fencekit%%' ORDER BY 1",
            (table,),
        ).fetchall()
    return [r[0] for r in rows]


def _stale(dsn: str, token: int, stmt: str) -> str:
    with pytest.raises(psycopg.Error) as exc:
        _write(dsn, token, stmt)
    return str(exc.value.sqlstate)


@pytest.mark.parametrize(
    "options",
    [[], ["--key", "account_id"], ["--scope", "table"], ["--key", "account_id", "--resource", "r"]],
    ids=["row", "key", "table", "named"],
)
def test_rename_follows_the_table(cli: Cli, dsn: str, options: list[str]) -> None:
    _run(
        dsn,
        "CREATE TABLE billing (account_id int NOT NULL, v int)",
        "INSERT INTO billing VALUES (1, 0)",
    )
    assert cli("protect", "billing", *options, "--dsn", dsn).code == 0
    _write(dsn, 10, "UPDATE billing SET v = 1")
    assert _stale(dsn, 9, "UPDATE billing SET v = 2") == "YF001"
    before = _fencekit_triggers(dsn, "billing")
    _run(dsn, "ALTER TABLE billing RENAME TO invoices")
    # The triggers moved with the table and still reject stale writes.
    assert _fencekit_triggers(dsn, "invoices") == before
    assert _stale(dsn, 9, "UPDATE invoices SET v = 3") == "YF001"
    status = cli("status", "--json", "--dsn", dsn)
    (drift,) = json.loads(status.out)["tables"][0]["drift"]
    assert drift["kind"] == "table_renamed"
    fix = drift["fix"].split(" (")[0]
    assert fix == "fencekit rename public.billing public.invoices --dsn DSN"
    r = cli(*fix.split()[1:-1], dsn)
    assert r.code == 0, r.err
    assert r.out.startswith("renamed the protection of public.billing to public.invoices")
    after = _fencekit_triggers(dsn, "invoices")
    assert len(after) == len(before)
    new_tag = object_tag("public", "invoices")
    assert all(t.startswith(f"fencekit_{new_tag}_") for t in after)
    old_tag = object_tag("public", "billing")
    assert _one(dsn, f"SELECT count(*) FROM pg_proc WHERE proname LIKE '{old_tag}%%'") == 0
    assert _one(dsn, "SELECT table_name FROM fencekit.protected") == "invoices"
    # Fences followed (a row fence's column, a key/table fence's resource): still stale.
    assert _stale(dsn, 9, "UPDATE invoices SET v = 4") == "YF001"
    _write(dsn, 10, "UPDATE invoices SET v = 5")
    # The stale write counted before the rename is still counted after it.
    doc = json.loads(cli("status", "--json", "--dsn", dsn).out)
    assert doc["drift"] is False, doc
    assert doc["tables"][0]["rejections"]["stale"] == 3
    # Re-protecting under the new name is a no-op: no second set of triggers.
    assert cli("protect", "invoices", *options, "--dsn", dsn).code == 0
    assert _fencekit_triggers(dsn, "invoices") == after
    # And the registry's spec unprotects cleanly.
    assert cli("unprotect", "invoices", "--dsn", dsn).code == 0
    assert _fencekit_triggers(dsn, "invoices") == []
    assert _one(dsn, "SELECT count(*) FROM fencekit.fences") == 0


def test_rename_refuses_a_table_that_is_not_the_renamed_one(cli: Cli, dsn: str) -> None:
    _run(
        dsn,
        "CREATE TABLE billing (account_id int NOT NULL, v int)",
        "CREATE TABLE other (account_id int NOT NULL, v int)",
    )
    assert cli("protect", "billing", "--dsn", dsn).code == 0
    r = cli("rename", "billing", "billing", "--dsn", dsn)
    assert r.code == 1
    assert "still exists under that name" in r.err
    r = cli("rename", "billing", "other", "--dsn", dsn)
    assert r.code == 1
    assert "public.other is not public.billing renamed" in r.err
    _run(dsn, "ALTER TABLE billing RENAME TO gone")
    r = cli("rename", "billing", "other", "--dsn", dsn)
    assert r.code == 1
    assert "public.other is not public.billing renamed" in r.err
    assert _one(dsn, "SELECT table_name FROM fencekit.protected") == "billing"
    r = cli("rename", "nothing", "gone", "--dsn", dsn)
    assert r.code == 1
    assert "public.nothing is not protected" in r.err


def test_the_sql_script_refuses_another_spec(cli: Cli, dsn: str, tmp_path: Path) -> None:
    _run(dsn, "CREATE TABLE billing (account_id int NOT NULL, v int)")
    assert cli("protect", "billing", "--key", "account_id", "--dsn", dsn).code == 0
    _run(dsn, "ALTER TABLE billing RENAME TO invoices")
    done = _psql(dsn, cli("sql", "rename", "billing", "invoices").out, tmp_path)
    assert done.returncode != 0
    assert "fencekit sql rename public.billing --key account_id public.invoices" in done.stderr
    done = _psql(
        dsn, cli("sql", "rename", "billing", "invoices", "--key", "account_id").out, tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert _one(dsn, "SELECT table_name FROM fencekit.protected") == "invoices"


def test_a_higher_orphaned_fence_under_the_new_name_is_kept(cli: Cli, dsn: str) -> None:
    """Fences left under the new name (an earlier table of that name) are never lowered."""
    _run(
        dsn,
        "CREATE TABLE billing (account_id int NOT NULL, v int)",
        "INSERT INTO billing VALUES (1, 0), (2, 0)",
        "INSERT INTO fencekit.fences (resource, key, fence) VALUES ('public.invoices', '1', 50)",
    )
    assert cli("protect", "billing", "--key", "account_id", "--dsn", dsn).code == 0
    _write(dsn, 20, "UPDATE billing SET v = 1")
    _run(dsn, "ALTER TABLE billing RENAME TO invoices")
    assert cli("rename", "billing", "invoices", "--dsn", dsn).code == 0
    fences: dict[str, Any] = dict(
        psycopg.connect(dsn)
        .execute("SELECT key, fence FROM fencekit.fences WHERE resource = 'public.invoices'")
        .fetchall()
    )
    assert fences == {"1": 50, "2": 20}
    assert _one(dsn, "SELECT count(*) FROM fencekit.fences WHERE resource = 'public.billing'") == 0
