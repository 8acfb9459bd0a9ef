"""``fencekit install|protect|unprotect --dsn`` against a real PostgreSQL, the printed scripts run
with the real psql, and the console script as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fencekit import sqlgen

from .conftest import Cli

Conn = psycopg.Connection[Any]
PSQL = "/usr/bin/psql"
FENCEKIT = str(Path(sys.executable).with_name("fencekit"))


def _setup(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for stmt in statements:
            conn.execute(stmt)


def _write(dsn: str, token: str | None, stmt: str) -> None:
    """Like psql: BEGIN; SELECT set_config('fencekit.token', ..., true); <stmt>; COMMIT;"""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("BEGIN")
        if token is not None:
            conn.execute("SELECT set_config('fencekit.token', %s, true)", (token,))
        conn.execute(stmt)
        conn.execute("COMMIT")


def _fence_triggers(dsn: str, table: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal "
            "ORDER BY 1",
            (table,),
        ).fetchall()
    return [r[0] for r in rows]


BILLING = (
    "CREATE TABLE billing_summary (account_id bigint PRIMARY KEY, total numeric NOT NULL)",
    "INSERT INTO billing_summary VALUES (42, 100)",
)


# -------------------------------------------------------------- install


@pytest.mark.all_servers
def test_install_then_reinstall(cli: Cli, raw_dsn: str) -> None:
    r = cli("install", "--dsn", raw_dsn)
    assert r.code == 0, r.err
    assert r.out == f"installed fencekit core version {sqlgen.CORE_VERSION}\n"
    with psycopg.connect(raw_dsn) as conn:
        row = conn.execute("SELECT value FROM fencekit.meta WHERE key = 'core_version'").fetchone()
    assert row == (str(sqlgen.CORE_VERSION),)
    again = cli("install", "--dsn", raw_dsn)
    assert again.code == 0
    assert "already installed" in again.out


def test_install_reads_the_dsn_from_the_environment(
    cli: Cli, raw_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FENCEKIT_DSN", raw_dsn)
    assert cli("install").code == 0
    assert cli("status").code == 0


# -------------------------------------------------------------- protect / unprotect --dsn


@pytest.mark.all_servers
def test_protect_then_a_stale_write_is_rejected(cli: Cli, dsn: str) -> None:
    _setup(dsn, *BILLING)
    r = cli("protect", "billing_summary", "--key", "account_id", "--dsn", dsn)
    assert r.code == 0, r.err
    assert r.out.startswith("protected public.billing_summary (key fence, key (account_id)")

    _write(dsn, "34", "UPDATE billing_summary SET total = 120 WHERE account_id = 42")
    with pytest.raises(psycopg.DatabaseError, match="stale write") as info:
        _write(dsn, "33", "UPDATE billing_summary SET total = 99 WHERE account_id = 42")
    assert info.value.sqlstate == "YF001"
    with pytest.raises(psycopg.DatabaseError) as info:
        _write(dsn, None, "UPDATE billing_summary SET total = 1 WHERE account_id = 42")
    assert info.value.sqlstate == "YF003"
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT total FROM billing_summary").fetchone() == (120,)

    # Idempotent: re-running is a no-op and succeeds.
    assert cli("protect", "billing_summary", "--key", "account_id", "--dsn", dsn).code == 0

    undo = cli("unprotect", "billing_summary", "--dsn", dsn)
    assert undo.code == 0, undo.err
    assert "unprotected public.billing_summary (was: key fence, key (account_id))" in undo.out
    assert _fence_triggers(dsn, "billing_summary") == []
    _write(dsn, None, "UPDATE billing_summary SET total = 1 WHERE account_id = 42")


def test_unqualified_table_resolves_through_the_servers_search_path(cli: Cli, dsn: str) -> None:
    _setup(dsn, "CREATE SCHEMA app", "CREATE TABLE app.jobs (id int PRIMARY KEY, state text)")
    app_dsn = f"{dsn} options='-csearch_path=app,public'"
    r = cli("protect", "jobs", "--dsn", app_dsn)
    assert r.code == 0, r.err
    assert "protected app.jobs (row fence, column fencekit_fence" in r.out
    with psycopg.connect(dsn) as conn:
        assert conn.execute(
            "SELECT schema_name, table_name FROM fencekit.protected"
        ).fetchall() == [("app", "jobs")]
    assert cli("unprotect", "jobs", "--dsn", app_dsn).code == 0


def test_row_fence_on_hostile_names(cli: Cli, dsn: str) -> None:
    _setup(
        dsn,
        'CREATE SCHEMA "My Schema"',
        'CREATE TABLE "My Schema"."Weird ""Name""" (id int PRIMARY KEY, "select" text)',
        'INSERT INTO "My Schema"."Weird ""Name""" VALUES (1, \'a\')',
    )
    table = '"My Schema"."Weird ""Name"""'
    assert cli("protect", table, "--column", "Fence Col", "--dsn", dsn).code == 0
    _write(dsn, "10", f"UPDATE {table} SET \"select\" = 'b'")
    with pytest.raises(psycopg.DatabaseError, match="stale write"):
        _write(dsn, "9", f"UPDATE {table} SET \"select\" = 'c'")
    assert cli("status", "--dsn", dsn).code == 0
    assert cli("unprotect", table, "--dsn", dsn).code == 0


@pytest.mark.parametrize(
    ("setup", "argv", "message"),
    [
        ((), ["nope"], "table nope does not exist (search_path: "),
        (BILLING, ["billing_summary", "--key", "missing"], "has no column 'missing'"),
        (
            ("CREATE TABLE t (id int PRIMARY KEY, k int)",),
            ["t", "--key", "k"],
            "key column 'k' of public.t is nullable",
        ),
        (
            ("CREATE TABLE t (id int, fencekit_fence text)",),
            ["t"],
            "column 'fencekit_fence' of public.t already exists with type text, not bigint",
        ),
        (
            ("CREATE VIEW v AS SELECT 1 AS x",),
            ["v"],
            "public.v is a view",
        ),
        (
            (
                "CREATE TABLE p (id int NOT NULL) PARTITION BY RANGE (id)",
                "CREATE TABLE p1 PARTITION OF p FOR VALUES FROM (1) TO (10)",
            ),
            ["p1"],
            "public.p1 is a partition of p",
        ),
    ],
)
def test_protect_validates_against_the_catalog_first(
    cli: Cli, dsn: str, setup: tuple[str, ...], argv: list[str], message: str
) -> None:
    _setup(dsn, *setup)
    r = cli("protect", *argv, "--dsn", dsn)
    assert r.code == 1
    assert message in r.err
    assert r.err.count("\n") == 1
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM fencekit.protected").fetchone() == (0,)


def test_protect_without_the_core_says_to_install_it(cli: Cli, raw_dsn: str) -> None:
    _setup(raw_dsn, *BILLING)
    r = cli("protect", "billing_summary", "--dsn", raw_dsn)
    assert r.code == 1
    assert "core is not installed" in r.err
    assert "fencekit install" in r.err
    assert cli("unprotect", "billing_summary", "--dsn", raw_dsn).code == 1


def test_changing_a_spec_in_place_is_refused(cli: Cli, dsn: str) -> None:
    _setup(dsn, *BILLING)
    assert cli("protect", "billing_summary", "--dsn", dsn).code == 0
    r = cli("protect", "billing_summary", "--key", "account_id", "--dsn", dsn)
    assert r.code == 1
    # The message names the fields that differ, with both values.
    assert "protected with another scope (row -> key), key (none -> account_id) (row fence" in r.err
    # A structural change is a move, fences carried; never unprotect.
    assert "fencekit move public.billing_summary --key account_id" in r.err
    assert "unprotect" not in r.err


def test_unprotect_of_an_unprotected_table_fails_clearly(cli: Cli, dsn: str) -> None:
    _setup(dsn, *BILLING)
    r = cli("unprotect", "billing_summary", "--dsn", dsn)
    assert r.code == 1
    assert "public.billing_summary is not protected" in r.err


def test_unprotect_uses_the_stored_spec(cli: Cli, dsn: str) -> None:
    _setup(dsn, "CREATE TABLE t (id int PRIMARY KEY, k int NOT NULL)")
    assert (
        cli(
            "protect",
            "t",
            "--key",
            "k",
            "--resource",
            "shared",
            "--on-equal",
            "reject",
            "--dsn",
            dsn,
        ).code
        == 0
    )
    assert _fence_triggers(dsn, "t")
    assert cli("unprotect", "t", "--dsn", dsn).code == 0
    assert _fence_triggers(dsn, "t") == []
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM fencekit.resources").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM fencekit.protected").fetchone() == (0,)


def test_lock_timeout_gives_up_without_changing_anything(cli: Cli, dsn: str) -> None:
    _setup(dsn, *BILLING)
    holder = psycopg.connect(dsn)
    try:
        holder.execute("UPDATE billing_summary SET total = total")  # holds ROW EXCLUSIVE
        r = cli("protect", "billing_summary", "--lock-timeout", "200ms", "--dsn", dsn)
    finally:
        holder.rollback()
        holder.close()
    assert r.code == 1
    assert "lock_timeout 200ms" in r.err
    assert "nothing was changed" in r.err
    with psycopg.connect(dsn) as conn:
        cols = conn.execute(
            "SELECT count(*) FROM pg_attribute WHERE attrelid = 'billing_summary'::regclass "
            "AND attname = 'fencekit_fence'"
        ).fetchone()
    assert cols == (0,)


# -------------------------------------------------------------- psql and the console script


def _psql(dsn: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PSQL, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-v", "VERBOSITY=verbose", *args, dsn],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.all_servers
def test_printed_scripts_run_with_psql(cli: Cli, raw_dsn: str, tmp_path: Path) -> None:
    if not os.path.exists(PSQL):
        pytest.skip("psql is not installed (apt-get install postgresql-client)")
    install = tmp_path / "fencekit.sql"
    install.write_text(cli("sql", "install").out)
    r = _psql(raw_dsn, "-f", str(install))
    assert r.returncode == 0, r.stderr
    assert _psql(raw_dsn, "-f", str(install)).returncode == 0  # idempotent

    _setup(raw_dsn, *BILLING)
    protect = tmp_path / "protect.sql"
    protect.write_text(cli("sql", "protect", "billing_summary").out)
    assert _psql(raw_dsn, "-f", str(protect)).returncode == 0
    assert _psql(raw_dsn, "-f", str(protect)).returncode == 0  # re-run: no-op

    ok = (
        "BEGIN;\nSELECT set_config('fencekit.token', '34', true);\n"
        "UPDATE billing_summary SET total = 120 WHERE account_id = 42;\nCOMMIT;\n"
    )
    assert _psql(raw_dsn, stdin=ok).returncode == 0
    stale = _psql(raw_dsn, stdin=ok.replace("'34'", "'33'").replace("120", "99"))
    assert stale.returncode != 0
    assert "YF001" in stale.stderr
    assert "stale write to public.billing_summary" in stale.stderr

    undo = tmp_path / "unprotect.sql"
    undo.write_text(cli("sql", "unprotect", "billing_summary").out)
    assert _psql(raw_dsn, "-f", str(undo)).returncode == 0
    assert _fence_triggers(raw_dsn, "billing_summary") == []


def test_console_script_runs_as_a_subprocess(raw_dsn: str) -> None:
    env = {**os.environ, "FENCEKIT_DSN": raw_dsn}
    run = lambda *a: subprocess.run(  # noqa: E731
        [FENCEKIT, *a], capture_output=True, text=True, env=env, timeout=120
    )
    assert run("install").returncode == 0
    _setup(raw_dsn, *BILLING)
    r = run("protect", "billing_summary")
    assert r.returncode == 0, r.stderr
    status = run("status", "--json")
    assert status.returncode == 0, status.stderr
    assert '"table": "public.billing_summary"' in status.stdout
    bad = run("sql", "protect", "t", "--key", "k", "--scope", "table")
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr
