"""Lint every PL/pgSQL function fencekit installs: the core and what protect generates.

Every function in schema ``fencekit`` (the core, and
one protected table of each scope and option of tests/sqlgen/golden_specs.py) passes
``plpgsql_check`` (Debian's ``postgresql-15-plpgsql-check``, so on the ``debian15`` target):
no error and no warning of any level, unused variables, parameters and unreachable code
included. Trigger functions are checked against each table they fire on, with that trigger's
transition tables. In-comment options (``@plpgsql_check_options``) are ignored: a function
cannot switch its own lint off.

Dynamic SQL states its reason. plpgsql_check cannot see into ``EXECUTE``, so each one carries
a comment line ``-- dynamic SQL: <why>`` directly above it; a run of EXECUTE statements that
follow each other with nothing else between them shares one. Read from ``prosrc``: what runs
is what is checked.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import psycopg
import pytest

from fencekit.spec import TableName
from tests.lab import IN_CI
from tests.security.conftest import protect
from tests.sqlgen.golden_specs import SPECS

Conn = psycopg.Connection[Any]

# Every plpgsql function in schema fencekit, once per trigger that fires it (with that
# trigger's table and transition tables), else once without a relation.
_TARGETS = """
SELECT p.oid::regprocedure::text AS fn, COALESCE(t.tgrelid, 0)::regclass AS relid,
       t.tgoldtable, t.tgnewtable
  FROM pg_proc p
  LEFT JOIN pg_trigger t ON t.tgfoid = p.oid
 WHERE p.pronamespace = 'fencekit'::regnamespace
   AND p.prolang = (SELECT oid FROM pg_language WHERE lanname = 'plpgsql')
 ORDER BY 1, 2
"""

_CHECK = """
SELECT r.lineno, r.level, r.message, r.statement
  FROM plpgsql_check_function_tb(%s::regprocedure, %s::regclass,
                                 fatal_errors => false, other_warnings => true,
                                 performance_warnings => false, extra_warnings => true,
                                 security_warnings => false, oldtable => %s, newtable => %s,
                                 use_incomment_options => false) r
"""

REASON = re.compile(r"^\s*--\s*dynamic SQL:\s*\S")
# The EXECUTE statement, not CREATE TRIGGER's static EXECUTE FUNCTION / PROCEDURE.
DYNAMIC = re.compile(r"\bEXECUTE\b(?!\s+(?:FUNCTION|PROCEDURE)\b)", re.I)


def _need_plpgsql_check(conn: Conn) -> None:
    row = conn.execute(
        "SELECT 1 FROM pg_available_extensions WHERE name = 'plpgsql_check'"
    ).fetchone()
    if row is None:
        reason = (
            "plpgsql_check is not installed on Debian's PostgreSQL 15: "
            "apt-get install postgresql-15-plpgsql-check (scripts/_system.sh does as root)"
        )
        if IN_CI:
            pytest.fail(f"{reason} (CI=true: a missing lint is a failure, not a skip)")
        pytest.skip(reason)


def _protect_every_golden_spec(conn: Conn) -> None:
    """One table per golden spec (scope and option), each protected by that spec."""
    conn.execute("CREATE SCHEMA app")
    for name, spec in SPECS.items():
        table = "inv_" + name.replace("-", "_")
        conn.execute(
            f"CREATE TABLE app.{table} "
            "(id int PRIMARY KEY, tenant_id int, account_id int, amount int)"
        )
        protect(conn, dataclasses.replace(spec, table=TableName("app", table)))


def lint(conn: Conn) -> tuple[list[tuple[str, str, str]], int]:
    """Every plpgsql_check finding as (function, message, printable label), and how
    many (function, table) pairs were checked."""
    findings: list[tuple[str, str, str]] = []
    targets = conn.execute(_TARGETS).fetchall()
    for fn, relid, old, new in targets:
        for lineno, level, message, statement in conn.execute(
            _CHECK, (fn, relid, old, new)
        ).fetchall():
            where = f"{fn} on {relid}" if str(relid) != "-" else fn
            findings.append(
                (fn, message, f"{where} line {lineno} ({statement}): {level}: {message}")
            )
    return findings, len(targets)


def _blank_literals(src: str) -> str:
    """``src`` with string literals and comments blanked (newlines kept), so that a keyword
    inside a format string or a comment is not taken for code."""
    out: list[str] = []
    i, n = 0, len(src)
    while i < n:
        ch = src[i]
        if ch == "'":
            j = i + 1
            while j < n:
                if src[j] == "'" and j + 1 < n and src[j + 1] == "'":
                    j += 2
                elif src[j] == "'":
                    break
                else:
                    j += 1
            out.append("".join(c if c == "\n" else " " for c in src[i : j + 1]))
            i = j + 1
        elif src.startswith("--", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(c if c == "\n" else " " for c in src[i:j]))
            i = j
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def unexplained_executes(src: str) -> list[int]:
    """Line numbers (1-based) of EXECUTE statements in a PL/pgSQL body without the comment
    ``-- dynamic SQL: <why>`` directly above them (or above the run of EXECUTEs they are in)."""
    raw = src.split("\n")
    code = _blank_literals(src).split("\n")
    bad: list[int] = []
    covered = False  # a reason was given, and nothing but comments and EXECUTEs came since
    in_execute = False  # inside a (multi-line) EXECUTE statement
    for number, (line, text) in enumerate(zip(raw, code, strict=True), start=1):
        stripped = text.strip()
        if REASON.match(line):
            covered = True
            continue
        if not stripped:
            if line.strip():  # a comment line: keeps whatever came before it
                continue
            covered = False  # a blank line ends the run
            continue
        has_execute = DYNAMIC.search(text) is not None
        if has_execute:
            if not covered:
                bad.append(number)
            in_execute = True
        elif not in_execute:
            covered = False
        if re.search(r"\bLOOP$", stripped, re.I):
            in_execute = covered = False  # a FOR ... IN EXECUTE loop's body is not the run
        elif in_execute and stripped.endswith(";"):
            in_execute = False
    return bad


@pytest.mark.parametrize("pg_target", ["debian15"], indirect=True)
def test_every_function_passes_plpgsql_check(db: Conn) -> None:
    _need_plpgsql_check(db)
    db.execute("CREATE EXTENSION plpgsql_check")
    _protect_every_golden_spec(db)
    db.commit()

    found, checked = lint(db)
    # The lint saw the generated trigger functions with their tables, not just the core.
    triggers = db.execute(
        "SELECT count(*) FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid "
        "WHERE p.pronamespace = 'fencekit'::regnamespace"
    ).fetchone()
    assert triggers is not None
    assert triggers[0] >= 2 * len(SPECS)
    assert checked > triggers[0]
    labels = [label for _fn, _message, label in found]
    assert not labels, "plpgsql_check findings:\n  " + "\n  ".join(labels)

    # The lint can fail: a function with an unused variable and unreachable code is caught.
    db.execute(
        "CREATE FUNCTION fencekit.lint_probe() RETURNS int LANGUAGE plpgsql AS $fn$\n"
        "DECLARE\n  spare int;\nBEGIN\n  RETURN 1;\n  RETURN 2;\nEND\n$fn$"
    )
    probe = [label for fn, _, label in lint(db)[0] if fn == "fencekit.lint_probe()"]
    db.rollback()
    assert any('unused variable "spare"' in p for p in probe), probe
    assert any("unreachable code" in p for p in probe), probe


def test_dynamic_sql_states_its_reason(db: Conn) -> None:
    _protect_every_golden_spec(db)
    rows = db.execute(
        "SELECT p.oid::regprocedure::text, p.prosrc FROM pg_proc p "
        "WHERE p.pronamespace = 'fencekit'::regnamespace "
        "AND p.prolang = (SELECT oid FROM pg_language WHERE lanname = 'plpgsql') ORDER BY 1"
    ).fetchall()
    db.rollback()
    assert rows
    executing = [fn for fn, src in rows if DYNAMIC.search(_blank_literals(src))]
    assert executing, "no function uses EXECUTE any more: this test checks nothing"
    missing = {fn: lines for fn, src in rows if (lines := unexplained_executes(src))}
    assert not missing, (
        "EXECUTE without a '-- dynamic SQL: <why>' comment directly above it "
        f"(function: body line numbers): {missing}"
    )


@pytest.mark.parametrize(
    ("body", "bad"),
    [
        ("BEGIN\n  EXECUTE 'SELECT 1';\nEND", [2]),
        ("BEGIN\n  -- dynamic SQL: why\n  EXECUTE 'SELECT 1';\nEND", []),
        ("BEGIN\n  -- dynamic SQL:\n  EXECUTE 'SELECT 1';\nEND", [3]),  # no reason given
        ("BEGIN\n  -- dynamic SQL: why\n  -- and more\n  EXECUTE 'x';\nEND", []),
        # A run of EXECUTEs (with continuation lines) shares one reason...
        ("BEGIN\n  -- dynamic SQL: why\n  EXECUTE format('%I',\n    a);\n  EXECUTE 'y';\nEND", []),
        # ...but another statement in between ends it.
        ("BEGIN\n  -- dynamic SQL: why\n  EXECUTE 'x';\n  PERFORM 1;\n  EXECUTE 'y';\nEND", [5]),
        ("BEGIN\n  -- dynamic SQL: why\n\n  EXECUTE 'x';\nEND", [4]),
        ("BEGIN\n  -- dynamic SQL: why\n  FOR r IN EXECUTE 'x' LOOP\n  END LOOP;\nEND", []),
        ("BEGIN\n  FOR r IN EXECUTE 'x' LOOP\n  END LOOP;\nEND", [2]),
        (
            "BEGIN\n  -- dynamic SQL: why\n  FOR r IN EXECUTE 'x' LOOP\n"
            "    EXECUTE 'y';\n  END LOOP;\nEND",
            [4],
        ),
        ("BEGIN\n  RAISE NOTICE 'EXECUTE x'; -- EXECUTE y\n  /* EXECUTE */\nEND", []),
        ("BEGIN\n  PERFORM 'it''s EXECUTE';\n  execute 'x';\nEND", [3]),
        ("BEGIN\n  CREATE EVENT TRIGGER t ON ddl_command_end\n    EXECUTE FUNCTION f();\nEND", []),
    ],
)
def test_the_dynamic_sql_rule(body: str, bad: list[int]) -> None:
    assert unexplained_executes(body) == bad
