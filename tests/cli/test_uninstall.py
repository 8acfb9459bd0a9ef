"""Remove fencekit: ``fencekit uninstall`` / ``fencekit sql uninstall`` refuse
while tables are protected, changing nothing, unless told to unprotect them."""

from __future__ import annotations

import json
from pathlib import Path

from .conftest import Cli
from .test_unprotect_exact import _one, _psql, _run, _write


def _tables(dsn: str) -> None:
    _run(
        dsn,
        "CREATE TABLE r (id int NOT NULL, v int)",
        "CREATE TABLE k (id int NOT NULL, v int)",
        "CREATE TABLE p (id int NOT NULL, v int) PARTITION BY RANGE (id)",
        "CREATE TABLE p1 PARTITION OF p FOR VALUES FROM (0) TO (10)",
        "INSERT INTO r VALUES (1, 0)",
        "INSERT INTO k VALUES (1, 0)",
    )


def _fencekit_left(dsn: str) -> tuple[int, int, int]:
    """fencekit triggers anywhere, fence columns, the schema."""
    return (
        _one(dsn, "SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'fencekit%'"),
        _one(dsn, "SELECT count(*) FROM pg_attribute WHERE attname = 'fencekit_fence'"),
        _one(dsn, "SELECT count(*) FROM pg_namespace WHERE nspname = 'fencekit'"),
    )


def test_uninstall_refuses_while_tables_are_protected(cli: Cli, dsn: str) -> None:
    _tables(dsn)
    assert cli("protect", "r", "--dsn", dsn).code == 0
    r = cli("uninstall", "--dsn", dsn)
    assert r.code == 1
    assert "1 table(s) are still protected (public.r); nothing was removed" in r.err
    assert "--unprotect-all" in r.err
    assert _fencekit_left(dsn)[2] == 1
    _write(dsn, 3, "UPDATE r SET v = 1")


def test_uninstall_unprotect_all_removes_everything(cli: Cli, dsn: str) -> None:
    _tables(dsn)
    for argv in (["r"], ["k", "--key", "id"], ["p", "--scope", "table"]):
        assert cli("protect", *argv, "--dsn", dsn).code == 0
    r = cli("uninstall", "--unprotect-all", "--json", "--dsn", dsn)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["action"] == "uninstall"
    assert sorted(doc["unprotected"]) == ["public.k", "public.p", "public.r"]
    assert _fencekit_left(dsn) == (0, 0, 0)
    _run(dsn, "UPDATE r SET v = 2", "UPDATE k SET v = 2", "INSERT INTO p VALUES (1, 1)")
    again = cli("uninstall", "--dsn", dsn)
    assert again.code == 0
    assert "not installed" in again.out
    assert cli("install", "--dsn", dsn).code == 0  # and it comes back cleanly


def test_uninstall_with_nothing_protected(cli: Cli, dsn: str) -> None:
    r = cli("uninstall", "--dsn", dsn)
    assert r.code == 0, r.err
    assert "removed fencekit" in r.out
    assert _fencekit_left(dsn)[2] == 0


def test_sql_uninstall_refuses_then_unprotects_all(cli: Cli, dsn: str, tmp_path: Path) -> None:
    _tables(dsn)
    for argv in (["r"], ["k", "--key", "id"], ["p", "--scope", "table"]):
        assert cli("protect", *argv, "--dsn", dsn).code == 0
    refused = _psql(dsn, cli("sql", "uninstall").out, tmp_path)
    assert refused.returncode != 0
    assert "tables are still protected; nothing was removed" in refused.stderr
    assert _fencekit_left(dsn)[2] == 1
    done = _psql(dsn, cli("sql", "uninstall", "--unprotect-all").out, tmp_path)
    assert done.returncode == 0, done.stderr
    assert _fencekit_left(dsn) == (0, 0, 0)
