"""Papercuts: status and fences run without fencekit_admin say it is needed; a
``fences --key`` value the key column refuses is fencekit's error, not PostgreSQL's raw one."""

from __future__ import annotations

from typing import Any

import psycopg

from .conftest import Cli

WRITER = "SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public"


def _protected(cli: Cli, dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, v int)")
    assert cli("protect", "--dsn", dsn, "t", "--scope", "key", "--key", "id").code == 0


def test_status_and_fences_without_admin_name_fencekit_admin(
    cli: Cli, dsn: str, make_role: Any
) -> None:
    _protected(cli, dsn)
    app = make_role("papercut_app", WRITER, "fencekit_writer")
    for argv in (("status",), ("fences", "t")):
        result = cli(*argv, "--dsn", app)
        assert result.code == 1
        assert "permission denied" in result.err
        assert "fencekit_admin" in result.err, result.err
        assert "GRANT fencekit_admin TO" in result.err


def test_fences_key_of_the_wrong_type_is_fencekits_error(cli: Cli, dsn: str) -> None:
    _protected(cli, dsn)
    result = cli("fences", "--dsn", dsn, "t", "--key", "abc")
    assert result.code == 2
    assert result.err.startswith("fencekit fences: error: --key abc does not fit")
    assert "bigint" in result.err


def test_a_protect_whose_spec_differs_names_the_field(cli: Cli, dsn: str) -> None:
    _protected(cli, dsn)
    # A policy: changed in place, the field named, no move suggested.
    result = cli(
        "protect", "--dsn", dsn, "t", "--scope", "key", "--key", "id", "--on-missing", "allow"
    )
    assert result.code == 0, result.err
    text = result.out + result.err
    assert "on_missing (reject -> allow)" in text
    assert "move" not in text
    # The key: a move, suggested, the field named.
    with psycopg.connect(dsn) as conn:
        conn.execute("ALTER TABLE t ALTER COLUMN v SET NOT NULL")
    result = cli("protect", "--dsn", dsn, "t", "--scope", "key", "--key", "v")
    assert result.code == 1
    assert "key (id -> v)" in result.err
    assert "fencekit move" in result.err
