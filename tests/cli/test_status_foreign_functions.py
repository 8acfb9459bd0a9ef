"""``fencekit status`` reports every function in schema fencekit that fencekit did not create
(``foreign_function``), whoever owns it, and fixes it by dropping it: an overload there can win
a call of fencekit's own code, so handing it to the installer would keep it live. A fresh core
with a protected table of each scope has none."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from .conftest import Cli


def _sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for stmt in statements:
            conn.execute(stmt)


def _status(cli: Cli, dsn: str) -> tuple[int, dict[str, Any]]:
    r = cli("status", "--json", "--dsn", dsn)
    return r.code, json.loads(r.out)


@pytest.fixture
def tables(cli: Cli, dsn: str) -> None:
    for name, opts in {
        "f_row": [],
        "f_key": ["--scope", "key", "--key", "k"],
        "f_table": ["--scope", "table"],
    }.items():
        _sql(dsn, f"CREATE TABLE {name} (id int PRIMARY KEY, k int NOT NULL, v text)")
        assert cli("protect", name, *opts, "--dsn", dsn).code == 0


def test_fencekits_own_functions_are_not_reported(cli: Cli, dsn: str, tables: None) -> None:
    _, doc = _status(cli, dsn)
    kinds = [d["kind"] for d in doc["core_drift"]]
    assert "foreign_function" not in kinds


@pytest.mark.parametrize("owner", ["admin", "installer"])
def test_an_overload_in_schema_fencekit_is_reported_and_dropped_never_reowned(
    cli: Cli, dsn: str, tables: None, make_role: Any, owner: str
) -> None:
    """The overload of the reviewed attack (``check_key_types(text, oid)``, exact for a call
    passing TG_RELID uncast), owned by a fencekit_admin member or by the installer itself."""
    make_role("ff_admin", "fencekit_admin")
    _sql(
        dsn,
        "CREATE FUNCTION fencekit.check_key_types(tag text, relid oid) RETURNS void "
        "LANGUAGE sql AS 'SELECT'",
        "CREATE FUNCTION fencekit.helper_nobody_made(x int) RETURNS int LANGUAGE sql AS 'SELECT x'",
    )
    if owner == "admin":
        _sql(
            dsn,
            "ALTER FUNCTION fencekit.check_key_types(text, oid) OWNER TO ff_admin",
            "ALTER FUNCTION fencekit.helper_nobody_made(int) OWNER TO ff_admin",
        )
    code, doc = _status(cli, dsn)
    assert code == 1
    foreign = {d["object"]: d for d in doc["core_drift"] if d["kind"] == "foreign_function"}
    assert set(foreign) == {
        "fencekit.check_key_types(text,oid)",
        "fencekit.helper_nobody_made(integer)",
    }
    assert foreign["fencekit.check_key_types(text,oid)"]["fix"] == (
        "DROP FUNCTION fencekit.check_key_types(text,oid)"
    )
    for d in doc["core_drift"]:
        assert "check_key_types" not in d["fix"] or d["fix"].startswith("DROP FUNCTION"), d
        assert "OWNER TO" not in d["fix"] or "check_key_types" not in " ".join(d["objects"]), d
    # The fix status prints is the fix.
    _sql(dsn, *(d["fix"] for d in foreign.values()))
    _, doc = _status(cli, dsn)
    assert [d for d in doc["core_drift"] if d["kind"] == "foreign_function"] == []
