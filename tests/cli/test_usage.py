"""Command-line surface: help for every subcommand, usage errors exit 2 with one clear line,
failures exit 1 without a traceback, optional groups load lazily."""

from __future__ import annotations

import importlib
import types

import pytest

import fencekit.cli
from fencekit import __version__

from .conftest import Cli

SUBCOMMANDS = [
    ["install"],
    ["sql"],
    ["sql", "install"],
    ["sql", "protect"],
    ["sql", "unprotect"],
    ["protect"],
    ["unprotect"],
    ["status"],
]


def test_top_level_help_lists_every_core_subcommand(cli: Cli) -> None:
    r = cli("--help")
    assert r.code == 0
    for name in ("install", "sql", "protect", "unprotect", "status"):
        assert f"    {name}" in r.out


@pytest.mark.parametrize("argv", SUBCOMMANDS, ids=" ".join)
def test_every_subcommand_has_help_with_an_example(cli: Cli, argv: list[str]) -> None:
    r = cli(*argv, "--help")
    assert r.code == 0
    assert f"usage: fencekit {' '.join(argv)}" in r.out
    assert "example" in r.out
    assert "fencekit " in r.out.split("example")[1]


def test_version(cli: Cli) -> None:
    r = cli("--version")
    assert (r.code, r.out.strip()) == (0, f"fencekit {__version__}")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["sql", "protect", "t", "--bogus"], "unrecognized arguments: --bogus"),
        (["sql", "protect", "a b"], "cannot read table name 'a b'"),
        (["sql", "protect", 'x."unclosed'], "cannot read table name"),
        (["sql", "protect", "t", "--key", "k", "--scope", "row"], "only make sense with scope"),
        (["sql", "protect", "t", "--resource", "billing"], "named resource needs scope"),
        (["sql", "protect", "t", "--scope", "key"], "needs at least one key column"),
        (["sql", "protect", "t", "--scope", "bogus"], "invalid choice: 'bogus'"),
        (["sql", "protect", "t", "--lock-timeout", "5 parsecs"], "not a duration"),
        (["sql", "protect", "fencekit.fences"], "fencekit's own tables"),
        (["sql", "protect", "t", "--auto-cover"], "unrecognized arguments: --auto-cover"),
        (["sql", "protect", "t", "--issuer", "Not Valid"], "issuer must be"),
        (["sql", "protect"], "the following arguments are required: TABLE"),
        (["protect", "t"], "--dsn is required (or set FENCEKIT_DSN)"),
        (["unprotect", "t"], "--dsn is required"),
        (["status"], "--dsn is required"),
        (["install"], "--dsn is required"),
        (["nonsense"], "invalid choice: 'nonsense'"),
    ],
)
def test_usage_errors_exit_2_with_one_line(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, argv: list[str], message: str
) -> None:
    monkeypatch.delenv("FENCEKIT_DSN", raising=False)
    r = cli(*argv)
    assert r.code == 2, r.err
    assert message in r.err
    assert r.err.count("\n") == 1, r.err
    assert "Traceback" not in r.err
    assert "--help" in r.err
    assert r.out == ""


def test_connection_failure_is_one_line_exit_1(cli: Cli, tmp_path: object) -> None:
    r = cli("status", "--dsn", f"host={tmp_path} port=1 dbname=nowhere connect_timeout=2")
    assert r.code == 1
    assert r.err.startswith("fencekit status: error: ")
    assert r.err.count("\n") == 1
    assert "Traceback" not in r.err


def test_debug_shows_the_traceback(cli: Cli, tmp_path: object) -> None:
    import psycopg

    with pytest.raises(psycopg.OperationalError):
        cli("--debug", "status", "--dsn", f"host={tmp_path} port=1 dbname=nowhere")


def test_missing_file_is_a_failure_not_a_traceback(cli: Cli, tmp_path: object) -> None:
    r = cli("sql", "protect", "t", "--from-ddl", f"{tmp_path}/nope.sql")
    assert r.code == 1
    assert "cannot read schema file" in r.err
    assert "nope.sql" in r.err


# -------------------------------------------------------------- lazy subcommand groups


def _fake_imports(monkeypatch: pytest.MonkeyPatch, failures: dict[str, ModuleNotFoundError]):
    real = importlib.import_module

    def fake(name: str, package: str | None = None) -> types.ModuleType:
        if name in failures:
            raise failures[name]
        return real(name, package)

    monkeypatch.setattr(fencekit.cli.importlib, "import_module", fake)


def test_group_needing_an_extra_explains_which_to_install(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_imports(
        monkeypatch,
        {"fencekit.cli.alembic": ModuleNotFoundError("No module named 'alembic'", name="alembic")},
    )
    r = cli("--help")
    assert r.code == 0
    assert "alembic" in r.out
    assert "unavailable" in r.out
    r = cli("alembic", "init", "x")
    assert r.code == 1
    assert "pip install 'pg-fencekit[alembic]'" in r.err
    assert cli("sql", "install").code == 0  # the rest keeps working


def test_group_not_written_yet_is_left_out(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    name = "fencekit.cli.chaos"
    _fake_imports(monkeypatch, {name: ModuleNotFoundError(f"No module named {name!r}", name=name)})
    r = cli("--help")
    assert r.code == 0
    assert "chaos" not in r.out


def test_real_import_error_is_not_hidden(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_imports(
        monkeypatch,
        {"fencekit.cli.demo": ModuleNotFoundError("No module named 'typo'", name="typo")},
    )
    with pytest.raises(ModuleNotFoundError, match="typo"):
        cli("--help")
