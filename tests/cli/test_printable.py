"""Every command's output reaches the terminal without control characters: names and text from
the database (a trigger's name, a writer's ``application_name``) could otherwise hold terminal
control sequences that redraw what the screen shows (a drift line erased, "enforced" printed over
a refusal)."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from fencekit.cli.printable import shown
from fencekit.spec import FenceSpec, TableName
from fencekit.sqlgen import protect_statements
from tests.cli.conftest import Cli

ERASE_LINE_UP = "\x1b[1A\x1b[2K"  # cursor up one line, erase it
CSI_C1 = "\x9b2K"  # the same erase through the one-character C1 introducer


def test_shown_escapes_controls_but_newline_and_tab() -> None:
    assert shown("a\tb\nc") == "a\tb\nc"
    assert shown(f"x{ERASE_LINE_UP}y") == "x\\x1b[1A\\x1b[2Ky"
    assert shown(f"{CSI_C1}\r\u202e") == "\\x9b2K\\r\\u202e"
    assert shown("fencekit: jobs — übersicht") == "fencekit: jobs — übersicht"


def test_status_prints_a_trigger_name_with_control_characters_escaped(
    cli: Cli, db: psycopg.Connection[Any], dsn: str
) -> None:
    db.execute("CREATE TABLE accounts (id bigint PRIMARY KEY, balance numeric NOT NULL)")
    for s in protect_statements(FenceSpec(TableName("public", "accounts"))):
        db.execute(s)
    name = f"a{ERASE_LINE_UP}{CSI_C1}"
    db.execute(
        f'CREATE TRIGGER "{name}" BEFORE UPDATE ON accounts FOR EACH ROW '
        "WHEN (pg_catalog.set_config('fencekit.token', '999999', true) IS NOT NULL) "
        "EXECUTE FUNCTION pg_catalog.suppress_redundant_updates_trigger()"
    )
    db.commit()
    r = cli("status", "--dsn", dsn)
    assert r.code == 1
    printed = r.out + r.err
    assert "\x1b" not in printed
    assert "\x9b" not in printed
    assert "a\\x1b[1A\\x1b[2K\\x9b2K" in printed  # the name, readable and on its own line


def test_enforce_prints_a_table_name_with_control_characters_escaped(
    cli: Cli, db: psycopg.Connection[Any], dsn: str
) -> None:
    table = f"jobs{ERASE_LINE_UP}"
    db.execute(f'CREATE TABLE "{table}" (id int PRIMARY KEY, status text)')
    db.execute(f"INSERT INTO \"{table}\" VALUES (1, 'new')")
    for s in protect_statements(FenceSpec(TableName("public", table), on_missing="allow")):
        db.execute(s)
    db.commit()
    with psycopg.connect(make_conninfo(dsn, application_name="w"), autocommit=True) as c:
        c.execute(f"UPDATE \"{table}\" SET status = 'doing' WHERE id = 1")
    r = cli("enforce", f'public."{table}"', "--window", "1h", "--dsn", dsn)
    assert r.code == 1
    printed = r.out + r.err
    assert "\x1b" not in printed
    assert "jobs\\x1b[1A\\x1b[2K" in printed  # the name, shown escaped
    assert "Nothing was changed" in r.err
