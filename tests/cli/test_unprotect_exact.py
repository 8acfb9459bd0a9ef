"""Unprotect exactly what is there: a generated unprotect script checks at run
time that the registry holds the spec it was generated for, and otherwise refuses, changing
nothing, with the command that generates the right script in its hint; the last table of a
resource takes its fences along, a shared named resource keeps them; ``status`` reports
orphaned fences. A re-run of a protect script is quiet."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fencekit import sqlgen
from fencekit.spec import FenceSpec, Scope, TableName

from .conftest import Cli

Conn = psycopg.Connection[Any]
PSQL = "/usr/bin/psql"


def _run(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for stmt in statements:
            conn.execute(stmt)


def _one(dsn: str, query: str) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
    return row[0] if row else None


def _psql(dsn: str, script: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    f = tmp_path / "script.sql"
    f.write_text(script, encoding="utf-8")
    return subprocess.run(
        [PSQL, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(f), dsn],
        capture_output=True,
        text=True,
        check=False,
    )


def _write(dsn: str, token: int, stmt: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("BEGIN")
        conn.execute("SELECT set_config('fencekit.token', %s, true)", (str(token),))
        conn.execute(stmt)
        conn.execute("COMMIT")


KEYED = FenceSpec(TableName("public", "ledger"), scope=Scope.KEY, key=("account_id",))


def _ledger(dsn: str) -> None:
    _run(
        dsn,
        "CREATE TABLE ledger (account_id int NOT NULL, amount int NOT NULL)",
        "INSERT INTO ledger VALUES (1, 10)",
    )


def test_a_script_for_another_spec_refuses_and_changes_nothing(
    cli: Cli, dsn: str, tmp_path: Path
) -> None:
    _ledger(dsn)
    assert cli("protect", "ledger", "--key", "account_id", "--dsn", dsn).code == 0
    _write(dsn, 7, "UPDATE ledger SET amount = 11")
    # The case: a row-fence script for a key-fenced table.
    wrong = cli("sql", "unprotect", "ledger")
    assert wrong.code == 0
    done = _psql(dsn, wrong.out, tmp_path)
    assert done.returncode != 0
    assert "fencekit.protected holds" in done.stderr
    assert "fencekit sql unprotect public.ledger --key account_id" in done.stderr
    # Nothing changed: registry row, triggers and fences are all there.
    assert _one(dsn, "SELECT count(*) FROM fencekit.protected") == 1
    assert _one(dsn, "SELECT count(*) FROM fencekit.fences WHERE resource = 'public.ledger'") == 1
    with pytest.raises(psycopg.Error) as stale:
        _write(dsn, 6, "UPDATE ledger SET amount = 12")
    assert stale.value.sqlstate == "YF001"
    # The command from the hint generates a script that runs.
    right = cli("sql", "unprotect", "public.ledger", "--key", "account_id")
    assert _psql(dsn, right.out, tmp_path).returncode == 0
    assert _one(dsn, "SELECT count(*) FROM fencekit.protected") == 0
    assert _one(dsn, "SELECT count(*) FROM fencekit.fences") == 0  # the last table: fences go


def test_a_policy_mismatch_is_refused_too(cli: Cli, dsn: str, tmp_path: Path) -> None:
    _ledger(dsn)
    assert cli("protect", "ledger", "--on-missing", "allow", "--dsn", dsn).code == 0
    done = _psql(dsn, cli("sql", "unprotect", "ledger").out, tmp_path)
    assert done.returncode != 0
    assert "fencekit sql unprotect public.ledger --on-missing allow" in done.stderr
    assert _one(dsn, "SELECT count(*) FROM fencekit.protected") == 1


def test_unprotect_of_an_unknown_table_cleans_leftovers_and_says_so(
    cli: Cli, dsn: str, tmp_path: Path
) -> None:
    _ledger(dsn)
    done = _psql(dsn, cli("sql", "unprotect", "ledger").out, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "is not in fencekit.protected; removing leftover fencekit objects only" in done.stderr


def test_a_shared_named_resource_keeps_its_fences_until_its_last_table(cli: Cli, dsn: str) -> None:
    _run(
        dsn,
        "CREATE TABLE a (account_id int NOT NULL, v int)",
        "CREATE TABLE b (account_id int NOT NULL, v int)",
        "INSERT INTO a VALUES (1, 0)",
    )
    for t in ("a", "b"):
        r = cli("protect", t, "--key", "account_id", "--resource", "billing", "--dsn", dsn)
        assert r.code == 0, r.err
    _write(dsn, 9, "UPDATE a SET v = 1")
    assert cli("unprotect", "a", "--dsn", dsn).code == 0
    assert _one(dsn, "SELECT fence FROM fencekit.fences WHERE resource = 'billing'") == 9
    assert cli("unprotect", "b", "--dsn", dsn).code == 0
    assert _one(dsn, "SELECT count(*) FROM fencekit.fences") == 0


def test_status_reports_orphaned_fences_with_the_delete(cli: Cli, dsn: str) -> None:
    _run(
        dsn,
        "INSERT INTO fencekit.fences (resource, key, fence) VALUES ('public.gone', '1', 5)",
    )
    r = cli("status", "--dsn", dsn)
    assert r.code == 1
    assert "[orphaned_fences]" in r.out
    assert "DELETE FROM fencekit.fences WHERE resource = 'public.gone'" in r.out
    r = cli("status", "--json", "--dsn", dsn)
    import json

    kinds = [d["kind"] for d in json.loads(r.out)["core_drift"]]
    assert kinds == ["orphaned_fences"]
    _run(dsn, "DELETE FROM fencekit.fences WHERE resource = 'public.gone'")
    assert cli("status", "--dsn", dsn).code == 0


SPECS = [
    FenceSpec(TableName("public", "t")),
    KEYED,
    FenceSpec(
        TableName("My Schema", "it's"),
        scope=Scope.KEY,
        key=("a b", "c"),
        resource="shared res",
        issuer="etcd",
        on_equal="reject",
    ),
    FenceSpec(TableName("s", "t"), scope=Scope.TABLE, on_missing="allow"),
    FenceSpec(TableName("s", "Row"), column="my fence"),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.table.dotted)
def test_the_hint_command_is_what_status_prints(db: Conn, spec: FenceSpec) -> None:
    """The core function that writes the hint's options agrees with FenceSpec.cli_args."""
    import json

    row = db.execute(
        "SELECT fencekit.spec_args(%(table)s, %(spec)s::jsonb)",
        {"spec": json.dumps(spec.as_dict()), "table": spec.table.sql},
    ).fetchone()
    assert row is not None
    assert row[0] == spec.cli_args()


def test_a_rerun_of_a_protect_script_is_quiet(cli: Cli, dsn: str, tmp_path: Path) -> None:
    _ledger(dsn)
    for argv in (["ledger"], ["ledger", "--column", "Fence Col"]):
        script = cli("sql", "protect", *argv).out
        first = _psql(dsn, script, tmp_path)
        assert first.returncode == 0, first.stderr
        second = _psql(dsn, script, tmp_path)
        assert second.returncode == 0, second.stderr
        assert "NOTICE" not in second.stderr, second.stderr
        _psql(dsn, cli("sql", "unprotect", *argv).out, tmp_path)
    for argv in (["ledger", "--key", "account_id", "--resource", "r", "--issuer", "etcd"],):
        script = cli("sql", "protect", *argv).out
        assert _psql(dsn, script, tmp_path).returncode == 0
        second = _psql(dsn, script, tmp_path)
        assert second.returncode == 0, second.stderr
        assert "NOTICE" not in second.stderr, second.stderr
    assert sqlgen.TEMPLATE_VERSION >= 1
