"""``fencekit sql ...`` prints exactly the generator's scripts, deterministically, and they parse
(PL/pgSQL bodies included). The committed DBA script matches the generator and ships in the
wheel."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fencekit import sqlgen
from fencekit.ddl import DdlError, parse_check
from fencekit.spec import FenceSpec, Scope, TableName

from .conftest import Cli

ROOT = Path(__file__).resolve().parents[2]
REGENERATE = "regenerate it with: .venv/bin/fencekit sql install > sql/fencekit-install.sql"

CASES = [
    (["billing_summary"], FenceSpec(TableName("public", "billing_summary"))),
    (
        ["app.ledger", "--key", "account_id", "--key", "region"],
        FenceSpec(TableName("app", "ledger"), scope=Scope.KEY, key=("account_id", "region")),
    ),
    (
        ["invoices", "--key", "account_id", "--resource", "billing", "--issuer", "etcd"],
        FenceSpec(
            TableName("public", "invoices"),
            scope=Scope.KEY,
            key=("account_id",),
            resource="billing",
            issuer="etcd",
        ),
    ),
    (
        ['"My Schema"."Weird ""Name"""', "--scope", "table", "--on-equal", "reject"],
        FenceSpec(TableName("My Schema", 'Weird "Name"'), scope=Scope.TABLE, on_equal="reject"),
    ),
    (
        ['"Ünïcode"."select"', "--column", "Fence Col", "--on-missing", "allow"],
        FenceSpec(TableName("Ünïcode", "select"), column="Fence Col", on_missing="allow"),
    ),
    (
        ["t" * 63, "--key", "k" * 63],
        FenceSpec(TableName("public", "t" * 63), scope=Scope.KEY, key=("k" * 63,)),
    ),
]


def test_committed_install_script_matches_the_generator() -> None:
    committed = (ROOT / "sql" / "fencekit-install.sql").read_text(encoding="utf-8")
    assert committed == sqlgen.render_install(), (
        f"sql/fencekit-install.sql is out of date: {REGENERATE}"
    )


def test_sql_install_prints_the_generator_output_exactly(cli: Cli) -> None:
    r = cli("sql", "install")
    assert (r.code, r.err) == (0, "")
    assert r.out == sqlgen.render_install()
    parse_check(r.out)
    assert "lock_timeout = '250ms'" in cli("sql", "install", "--lock-timeout", "250ms").out


@pytest.mark.parametrize(("argv", "spec"), CASES, ids=lambda v: str(v)[:40])
def test_sql_protect_and_unprotect_print_the_generator_scripts(
    cli: Cli, argv: list[str], spec: FenceSpec
) -> None:
    protect = cli("sql", "protect", *argv)
    assert (protect.code, protect.err) == (0, "")
    assert protect.out == sqlgen.render_protect(spec)
    assert cli("sql", "protect", *argv).out == protect.out  # deterministic
    parse_check(protect.out)

    undo = cli("sql", "unprotect", *argv)
    assert undo.code == 0
    assert undo.out == sqlgen.render_unprotect(spec)
    parse_check(undo.out)


def test_key_implies_key_scope_and_options_reach_the_script(cli: Cli) -> None:
    out = cli("sql", "protect", "t", "--key", "k", "--lock-timeout", "2s").out
    assert out == sqlgen.render_protect(
        FenceSpec(TableName("public", "t"), scope=Scope.KEY, key=("k",)), lock_timeout="2s"
    )
    assert "SET LOCAL lock_timeout = '2s';" in out


def test_output_is_stable_across_processes() -> None:
    # Hash randomisation must not reorder anything: compare two fresh interpreters.
    cmd = [sys.executable, "-m", "fencekit.cli", "sql", "protect", "t", "--key", "a", "--key", "b"]
    runs = {subprocess.run(cmd, capture_output=True, text=True, check=True).stdout for _ in "ab"}
    assert len(runs) == 1


def test_parse_check_rejects_broken_sql_and_plpgsql() -> None:
    with pytest.raises(DdlError, match="does not parse"):
        parse_check("CREATE TABLE (")
    broken_body = sqlgen.render_protect(FenceSpec(TableName("public", "t"))).replace(
        "RETURN NEW;", "RETURN NEW", 1
    )
    with pytest.raises(DdlError, match="PL/pgSQL body does not parse"):
        parse_check(broken_body)
    with pytest.raises(DdlError, match="PL/pgSQL"):
        parse_check("DO $$ BEGIN PERFORM 1 END $$;")


# -------------------------------------------------------------- packaging


def test_wheel_config_ships_the_sql_directory() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    force = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    assert force.get("sql") == "fencekit/_sql"
    assert (ROOT / "sql" / "README.md").is_file()
