"""docs/dev/threat-model.md covers every surface, and every test it names exists.

A new surface is not done until it has its rows: every function, table and view in
schema fencekit (the core, and what protect generates for one table of each scope and option,
named ``fencekit.<tag>_<suffix>``), every trigger protect makes, every CLI subcommand, every
``fencekit.*`` setting the SQL reads and every adapter module appears in the page's Surfaces
section, in the first column of a row that says what app, owner and admin are promised and
which test attacks it (``file::test``) or ``gap``. Every ``file::test`` the page names exists.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path
from typing import Any

import psycopg

from fencekit.cli import build_parser
from fencekit.spec import TableName
from tests.security.conftest import protect
from tests.sqlgen.golden_specs import SPECS

Conn = psycopg.Connection[Any]

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "dev" / "threat-model.md"
# Modules of the fencekit package that are not a surface of their own: the generator and what
# reads the catalog (their output is: the functions and commands above), the CLI's plumbing,
# the lab (bench, chaos, demo, ha, embedded) and shared internals.
INTERNAL = {
    "__init__",
    "__main__",
    "_alembic_entry",
    "_psycopg_async",
    "_psycopg_core",
    "_psycopg_errors",
    "_psycopg_internals",
    "_psycopg_sync",
    "_sqlalchemy_errors",
    "bench",
    "catalog",
    "chaos",
    "cli",
    "ddl",
    "declare",
    "demo",
    "embedded",
    "errors",
    "ha",
    "ident",
    "metrics",
    "monitoring",
    "spec",
    "sqlgen",
    "sqlsrc",
}
REF = re.compile(r"(tests/[\w/]+\.py)::(test_\w+)")


def _section(text: str, start: str, end: str) -> str:
    _, _, rest = text.partition(start)
    assert rest, f"{PAGE.name} has no section {start!r}"
    return rest.partition(end)[0]


def _rows(section: str) -> list[list[str]]:
    rows = []
    for line in section.splitlines():
        if line.startswith(("| `", "| fencekit")):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def _surfaces() -> tuple[set[str], list[list[str]]]:
    rows = _rows(_section(PAGE.read_text(), "\n## Surfaces\n", "\n## The other roles\n"))
    names: set[str] = set()
    for row in rows:
        names.update(re.findall(r"`([^`]+)`", row[0]))
    return names, rows


def _protected_db(db: Conn) -> dict[str, str]:
    """Protect one table per golden spec; tag -> '<tag>'."""
    db.execute("CREATE SCHEMA app")
    tags = {}
    for name, spec in SPECS.items():
        table = "tm_" + name.replace("-", "_")
        db.execute(f"CREATE TABLE app.{table} (id int PRIMARY KEY, tenant_id int, account_id int)")
        protect(db, dataclasses.replace(spec, table=TableName("app", table)))
    for (tag,) in db.execute("SELECT tag FROM fencekit.protected").fetchall():
        tags[tag] = "<tag>"
    return tags


def _generic(name: str, tags: dict[str, str]) -> str:
    for tag in tags:
        if tag in name:
            return name.replace(tag, "<tag>")
    return name


def _cli_commands() -> set[str]:
    out: set[str] = set()

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or not all(a.required for a in subs):
            out.add(prefix)
        for action in subs:
            for name, sub in action.choices.items():
                walk(sub, f"{prefix} {name}")

    walk(build_parser(), "fencekit")
    out.discard("fencekit")
    return out


def _settings() -> set[str]:
    text = "\n".join(
        p.read_text()
        for p in [
            *(ROOT / "fencekit" / "sqlsrc").rglob("*.sql"),
            *(ROOT / "fencekit" / "sqlgen").glob("*.py"),
        ]
    )
    names = {f"fencekit.{n}" for n in re.findall(r"current_setting\('fencekit\.(\w+)'", text)}
    return names | {"session_replication_role"}


def _modules() -> set[str]:
    pkg = ROOT / "fencekit"
    found = {p.stem for p in pkg.glob("*.py")} | {
        p.name for p in pkg.iterdir() if p.is_dir() and (p / "__init__.py").exists()
    }
    return {f"fencekit.{m}" for m in found - INTERNAL}


def test_every_database_object_has_its_rows(db: Conn) -> None:
    tags = _protected_db(db)
    functions = {
        _generic(f"fencekit.{n}", tags)
        for (n,) in db.execute(
            "SELECT proname FROM pg_proc WHERE pronamespace = 'fencekit'::regnamespace"
        ).fetchall()
    }
    relations = {
        f"fencekit.{n}"
        for (n,) in db.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = 'fencekit'::regnamespace "
            "AND relkind IN ('r', 'v', 'p')"
        ).fetchall()
    }
    triggers = {
        _generic(n, tags)
        for (n,) in db.execute(
            "SELECT DISTINCT t.tgname FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid "
            "WHERE p.pronamespace = 'fencekit'::regnamespace AND NOT t.tgisinternal"
        ).fetchall()
    }
    db.execute("SELECT fencekit.set_auto_cover(true)")
    events = {n for (n,) in db.execute("SELECT evtname FROM pg_event_trigger").fetchall()}
    db.rollback()
    assert len(functions) > 40
    assert triggers
    assert events
    surfaces, _ = _surfaces()
    missing = sorted((functions | relations | triggers | events) - surfaces)
    assert not missing, f"{PAGE.name}: no rows for {missing}"


def test_every_cli_command_setting_and_adapter_has_its_rows() -> None:
    surfaces, _ = _surfaces()
    wanted = _cli_commands() | _settings() | _modules()
    assert {"fencekit fence set", "fencekit.token", "fencekit.psycopg"} <= wanted
    missing = sorted(wanted - surfaces)
    assert not missing, f"{PAGE.name}: no rows for {missing}"


def test_every_row_makes_promises_and_names_its_attack() -> None:
    _, rows = _surfaces()
    assert len(rows) > 50
    bad = []
    for row in rows:
        if len(row) != 5:
            bad.append(f"{row[0]}: {len(row)} columns, not 5")
            continue
        surface, app, owner, admin, attacked = row
        if not REF.search(attacked) and attacked != "gap":
            bad.append(f"{surface}: names no test (file::test) and is not a gap")
        if attacked != "gap" and not (app and owner and admin):
            bad.append(f"{surface}: a role's promise is empty")
    assert not bad, "\n".join(bad)


def test_every_named_test_exists() -> None:
    refs = REF.findall(PAGE.read_text())
    assert refs
    missing = []
    for file, name in sorted(set(refs)):
        path = ROOT / file
        if not path.exists() or not re.search(rf"^(?:async )?def {name}\(", path.read_text(), re.M):
            missing.append(f"{file}::{name}")
    assert not missing, f"{PAGE.name} names tests that do not exist: {missing}"
