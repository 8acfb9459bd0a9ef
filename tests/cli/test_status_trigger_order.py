"""``fencekit status`` judges a foreign trigger by when PostgreSQL really fires it.

For every scope and every trigger timing (BEFORE/AFTER, STATEMENT/ROW), with a name sorting
before fencekit's and one sorting after, a trigger that sets ``fencekit.token`` is put on a
protected table. A tokenless and a stale
INSERT, UPDATE and DELETE are then tried for real. The events on which a write was judged by a
token it never presented are exactly the ones status reports the trigger as firing ahead of
fencekit's check on (``foreign_trigger_first``); otherwise status reports it as firing after
(``foreign_trigger``, or on a row fence ``foreign_trigger_fence_column``)."""

from __future__ import annotations

import json
import re
from typing import Any

import psycopg
import pytest

from fencekit.spec import DEFAULT_COLUMN

from .conftest import Cli

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)

EVENTS = ("INSERT", "UPDATE", "DELETE")
SWAP = (
    "CREATE OR REPLACE FUNCTION swap_fn() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN "
    "PERFORM set_config('fencekit.token', '999999', true); RETURN COALESCE(NEW, OLD); END$$"
)
WRITES = {
    "INSERT": "INSERT INTO acct VALUES (2, 42, 0)",
    "UPDATE": "UPDATE acct SET balance = balance + 1 WHERE id = 1",
    "DELETE": "DELETE FROM acct WHERE id = 1",
}


def _protect(cli: Cli, dsn: str, scope: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE acct (id bigint PRIMARY KEY, account_id bigint NOT NULL, "
            "balance numeric NOT NULL)"
        )
        conn.execute("INSERT INTO acct VALUES (1, 42, 0)")
    extra = {"row": [], "key": ["--key", "account_id"], "table": ["--scope", "table"]}[scope]
    r = cli("protect", "acct", *extra, "--dsn", dsn)
    assert r.code == 0, r.err
    with psycopg.connect(dsn) as conn:  # every fence at 10
        conn.execute("SELECT set_config('fencekit.token', '10', true)")
        conn.execute("UPDATE acct SET balance = 1")


def _let_through(dsn: str, token: int | None) -> set[str]:
    """The events on which a write with ``token`` (None: no token) was judged by a token it
    never presented: accepted though tokenless or stale, or (a row fence's INSERT, which takes
    any token for a new row) given a fence other than ``token``."""
    through = set()
    for event in EVENTS:
        with psycopg.connect(dsn) as conn:
            if token is not None:
                conn.execute("SELECT set_config('fencekit.token', %s, true)", (str(token),))
            try:
                conn.execute(WRITES[event])
            except psycopg.DatabaseError as exc:
                refused = exc.sqlstate
            else:
                refused = None
            # YF004: a row fence's row read a token other than the one its statement check
            # validated (the swap), and refused it.
            assert refused in (None, "YF001", "YF003", "YF004"), refused
            if refused is None:
                fence = _new_row_fence(conn) if event == "INSERT" else None
                if token is None or fence is None or fence != token:
                    through.add(event)
            conn.rollback()
    return through


def _new_row_fence(conn: psycopg.Connection[Any]) -> int | None:
    """The inserted row's fence column, on a row-fenced table (None: not row-fenced)."""
    has = conn.execute(
        "SELECT 1 FROM pg_attribute WHERE attrelid = 'acct'::regclass AND attname = %s",
        (DEFAULT_COLUMN,),
    ).fetchone()
    if has is None:
        return None
    row = conn.execute(f"SELECT {DEFAULT_COLUMN} FROM acct WHERE id = 2").fetchone()
    assert row is not None
    return int(row[0])


def _reported(cli: Cli, dsn: str, trigger: str) -> tuple[str, set[str]]:
    r = cli("status", "--json", "--dsn", dsn)
    doc: dict[str, Any] = json.loads(r.out)
    (table,) = [t for t in doc["tables"] if t["table"] == "public.acct"]
    (d,) = [d for d in table["drift"] if d["object"] == f"public.acct: trigger {trigger}"]
    if d["kind"] == "foreign_trigger_first":
        m = re.search(r"fires on ((?:INSERT|UPDATE|DELETE|TRUNCATE| )+) ahead", d["message"])
        assert m is not None, d["message"]
        return d["kind"], set(m.group(1).split())
    return d["kind"], set()


@pytest.mark.parametrize("scope", ["row", "key", "table"])
@pytest.mark.parametrize(
    "timing",
    [
        "BEFORE {e} ON acct FOR EACH STATEMENT",
        "BEFORE {e} ON acct FOR EACH ROW",
        "AFTER {e} ON acct FOR EACH ROW",
        "AFTER {e} ON acct FOR EACH STATEMENT",
    ],
)
@pytest.mark.parametrize("name", ["aa_swap", "zz_swap"])
def test_status_reports_a_token_setting_trigger_where_it_really_fires(
    cli: Cli, dsn: str, scope: str, timing: str, name: str
) -> None:
    _protect(cli, dsn, scope)
    assert _let_through(dsn, None) == set()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SWAP)
        conn.execute(
            f"CREATE TRIGGER {name} {timing.format(e=' OR '.join(EVENTS))} "
            "EXECUTE FUNCTION swap_fn()"
        )
    tokenless, stale = _let_through(dsn, None), _let_through(dsn, 5)
    kind, ahead = _reported(cli, dsn, name)
    if scope == "row":
        # Status judges a row fence by its row trigger: a trigger ahead of it can still change
        # the row first, though a token it swaps after the statement check is refused.
        assert tokenless | stale <= ahead, (kind, ahead, tokenless, stale)
    else:
        assert ahead == tokenless | stale, (kind, ahead, tokenless, stale)
    if ahead:
        assert kind == "foreign_trigger_first"
    elif scope == "row" and timing.startswith("BEFORE {e} ON acct FOR EACH ROW"):
        # After fencekit's row trigger: it cannot hand over a token, but it can overwrite the
        # fence column fencekit just set.
        assert kind == "foreign_trigger_fence_column"
    else:
        assert kind == "foreign_trigger"


def test_an_after_row_delete_trigger_on_a_key_fence_fires_ahead_of_its_check(
    cli: Cli, dsn: str
) -> None:
    # The table's root guard is an AFTER DELETE row trigger too (WHEN (false): never queued);
    # it is not the DELETE check. zz_swap sorts after it and still fires before the check.
    _protect(cli, dsn, "key")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SWAP)
        conn.execute(
            "CREATE TRIGGER zz_swap AFTER DELETE ON acct FOR EACH ROW EXECUTE FUNCTION swap_fn()"
        )
    assert _let_through(dsn, None) == {"DELETE"}
    assert _let_through(dsn, 5) == {"DELETE"}
    r = cli("status", "--json", "--dsn", dsn)
    assert r.code == 1
    kind, ahead = _reported(cli, dsn, "zz_swap")
    assert (kind, ahead) == ("foreign_trigger_first", {"DELETE"})
    (d,) = [
        d
        for t in json.loads(r.out)["tables"]
        for d in t["drift"]
        if d["object"] == "public.acct: trigger zz_swap"
    ]
    assert "_del" in d["message"]
    assert "_root" not in d["message"]
    assert "whatever its name" in d["fix"]
    assert "RENAME" not in d["fix"]
