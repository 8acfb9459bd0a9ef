"""``fencekit move`` / ``fencekit sql move`` and policy changes through ``fencekit protect``
: a table is never unprotected in between, and its fences are kept."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest

from .conftest import Cli
from .test_unprotect_exact import _one, _psql, _run, _write


def _sqlstate(dsn: str, token: int | None, stmt: str) -> str:
    def attempt() -> None:
        if token is None:
            _run(dsn, stmt)
        else:
            _write(dsn, token, stmt)

    with pytest.raises(psycopg.Error) as exc:
        attempt()
    return str(exc.value.sqlstate)


@pytest.fixture
def billing(dsn: str) -> str:
    _run(
        dsn,
        "CREATE TABLE billing (id int PRIMARY KEY, account_id int NOT NULL, summary text)",
    )
    return dsn


def test_protect_changes_a_policy_in_place_and_keeps_the_fences(cli: Cli, billing: str) -> None:
    dsn = billing
    assert cli("protect", "billing", "--key", "account_id", "--dsn", dsn).code == 0
    _write(dsn, 10, "INSERT INTO billing VALUES (1, 1, 'a')")
    r = cli("protect", "billing", "--key", "account_id", "--on-missing", "allow", "--dsn", dsn)
    assert r.code == 0, r.err
    assert "policies change in place" in r.err
    _run(dsn, "UPDATE billing SET summary = 'unfenced'")  # allowed now
    assert _sqlstate(dsn, 9, "UPDATE billing SET summary = 'stale'") == "YF001"
    assert _one(dsn, "SELECT fence FROM fencekit.fences WHERE key = '1'") == 10


def test_protect_refuses_a_structural_change_and_names_move(cli: Cli, billing: str) -> None:
    dsn = billing
    cli("protect", "billing", "--dsn", dsn)
    _write(dsn, 10, "INSERT INTO billing VALUES (1, 1, 'a')")
    r = cli("protect", "billing", "--key", "account_id", "--dsn", dsn)
    assert r.code == 1
    assert "fencekit move billing --key account_id" in r.err.replace("public.billing", "billing")
    assert _one(dsn, "SELECT fencekit_fence FROM billing") == 10  # nothing changed


def test_move_row_to_key_carries_the_fences(cli: Cli, billing: str) -> None:
    dsn = billing
    cli("protect", "billing", "--dsn", dsn)
    _write(dsn, 10, "INSERT INTO billing VALUES (1, 1, 'a')")
    _write(dsn, 20, "INSERT INTO billing VALUES (2, 1, 'b')")
    r = cli("move", "billing", "--key", "account_id", "--dsn", dsn, "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["action"] == "move"
    assert doc["moved"] is True
    assert doc["from"]["scope"] == "row"
    assert doc["spec"]["scope"] == "key"
    assert _sqlstate(dsn, 19, "UPDATE billing SET summary = 'late' WHERE id = 1") == "YF001"
    _write(dsn, 20, "UPDATE billing SET summary = 'holder' WHERE id = 1")
    r = cli("move", "billing", "--key", "account_id", "--dsn", dsn)
    assert r.code == 0
    assert "nothing to do" in r.out
    r = cli("move", "billing", "--key", "account_id", "--on-missing", "allow", "--dsn", dsn)
    assert r.code == 0
    assert "in place" in r.out
    assert _one(dsn, "SELECT fence FROM fencekit.fences WHERE key = '1'") == 20


def test_move_refuses_bad_input_and_changes_nothing(cli: Cli, billing: str) -> None:
    dsn = billing
    r = cli("move", "billing", "--key", "account_id", "--dsn", dsn)
    assert r.code == 1
    assert "not protected" in r.err
    cli("protect", "billing", "--dsn", dsn)
    r = cli("move", "billing", "--key", "nope", "--dsn", dsn)
    assert r.code == 1
    assert "no column 'nope'" in r.err
    r = cli("move", "billing", "--key", "summary", "--dsn", dsn)
    assert r.code == 1
    assert "nullable" in r.err
    r = cli("move", "nope", "--scope", "table", "--dsn", dsn)
    assert r.code == 1
    assert "does not exist" in r.err
    r = cli("move", "billing", "--scope", "row", "--column", "x", "--key", "id", "--dsn", dsn)
    assert r.code == 2
    assert _one(dsn, "SELECT spec ->> 'scope' FROM fencekit.protected") == "row"


def test_sql_move_from_options_runs_with_psql(cli: Cli, billing: str, tmp_path: Path) -> None:
    dsn = billing
    cli("protect", "billing", "--scope", "table", "--dsn", dsn)
    _write(dsn, 30, "INSERT INTO billing VALUES (1, 1, 'a')")
    r = cli("sql", "move", "billing", "--key", "account_id", "--from", "--scope table")
    assert r.code == 0, r.err
    assert "BEGIN;" in r.out
    assert "LOCK TABLE public.billing IN SHARE ROW EXCLUSIVE MODE" in r.out
    # Reading the spec from the database gives the same script.
    same = cli("sql", "move", "billing", "--key", "account_id", "--dsn", dsn)
    assert same.code == 0
    assert same.out == r.out
    done = _psql(dsn, r.out, tmp_path)
    assert done.returncode == 0, done.stderr
    assert _sqlstate(dsn, 29, "INSERT INTO billing VALUES (2, 2, 'new key, late')") == "YF001"
    _write(dsn, 30, "INSERT INTO billing VALUES (2, 2, 'holder')")
    # The same script again: the registry holds another spec now; it refuses, naming the fix.
    again = _psql(dsn, r.out, tmp_path)
    assert again.returncode != 0
    assert "fencekit sql move" in again.stderr
    assert _one(dsn, "SELECT spec ->> 'scope' FROM fencekit.protected") == "key"


def test_sql_move_usage_errors(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FENCEKIT_DSN", raising=False)
    r = cli("sql", "move", "billing", "--key", "account_id")
    assert r.code == 2
    assert "--from" in r.err
    r = cli("sql", "move", "billing", "--key", "a", "--from", "--key a")
    assert r.code == 2
    assert "nothing to move" in r.err
    r = cli("sql", "move", "billing", "--key", "a", "--from=--bogus")
    assert r.code == 2
    assert "--bogus" in r.err
    r = cli("sql", "move", "billing", "--key", "a", "--from", "'unbalanced")
    assert r.code == 2
    assert cli("sql", "move", "--help").code == 0
    assert cli("move", "--help").code == 0
