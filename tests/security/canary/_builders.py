"""Plausible arguments for every privileged entry point of the canary matrix.

An entry point is found by enumeration (pg_proc, pg_trigger, the CLI's parser, alembic's
registry, the Django operations module). A new one with no builder here fails the matrix with
a message that says to add one, so it gets its rows without anyone remembering to write them.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable

from tests.security.canary.conftest import (
    FRESH,
    PARTITIONED,
    PROTECTED,
    SWAPPED,
    UNPROTECTED,
    Table,
    spec_of,
)

#: Every table a privileged entry point is pointed at, by how it is planted.
TARGETS = PROTECTED + PARTITIONED + SWAPPED


def _lit(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _resource(t: Table) -> str:
    return f"app.{t.name}"


def _key(t: Table) -> str:
    return "'{1}'::text[]" if t.scope == "key" else "'{}'::text[]"


# -------------------------------------------------------------- SECURITY DEFINER functions
# proname -> table -> argument list (SQL expressions); None: the function takes no table.

DefinerArgs = Callable[[Table], list[str]]

DEFINER_ARGS: dict[str, DefinerArgs | None] = {
    "acquire": None,
    "release": None,
    "renew": None,
    "lease_token": None,
    "advance_fences": lambda t: [_lit(_resource(t)), _key(t), str(FRESH), "'accept'"],
    "claim_fence": lambda t: [f"{_lit('app.' + t.name)}::regclass", "'1'", str(FRESH)],
    "judge_fences": lambda t: [
        _lit(f"canary:{t.name}"),
        f"{_lit('app.' + t.name)}::regclass::oid",
        "'canary'",
        _lit(_resource(t)),
        _key(t),
        str(FRESH),
        "'accept'",
        "false",
    ],
    "reject": lambda t: [
        "'stale'",
        _lit(f"canary:{t.name}"),
        f"{_lit('app.' + t.name)}::regclass::oid",
        "'canary'",
        "NULL",
        _lit(_resource(t)),
        "'{}'::jsonb",
        "1",
        str(FRESH),
    ],
    "current_fence": lambda t: [_lit(_resource(t)), "'1'" if t.scope == "key" else "''"],
    "max_fence": lambda t: [_lit(_resource(t))],
    "record_unfenced_writer": lambda t: [
        _lit(f"canary:{t.name}"),
        f"{_lit('app.' + t.name)}::regclass::oid",
        "1",
    ],
}

#: The lease functions take a resource name, never a table.
LEASE_CALLS = {
    "acquire": "fencekit.acquire('canary:lease', 'canary-holder', '1 hour')",
    "lease_token": "fencekit.lease_token('canary:lease')",
    "renew": "fencekit.renew('canary:lease', 'canary-holder', 1, '1 hour')",
    "release": "fencekit.release('canary:lease', 'canary-holder', 1)",
}


#: Event trigger functions run from the DDL that fires them: each statement drops a target and
#: rolls the drop back (the canaries count in sequences, which the rollback keeps).
EVENT_CALLS: dict[str, Callable[[Table], str]] = {
    "forget_dropped_tables": lambda t: (
        f"DO $$ BEGIN DROP TABLE app.{t.name} CASCADE; "
        "RAISE EXCEPTION 'canary: roll the drop back'; END $$"
    ),
}


def _record(t: Table) -> str:
    return (
        f"fencekit.record_unfenced_writer({_lit(f'canary:{t.name}')},"
        f" {_lit('app.' + t.name)}::regclass::oid, 1)"
    )


#: The trigger functions on fencekit's own attribution tables fire at the commit of a record
#: (each statement runs in a session of its own and commits): a writer's row, a table's
#: overflow (51 writers, one past the default cap of 50) and a REPEATABLE READ log append.
COMMIT_TRIGGER_CALLS: dict[str, Callable[[Table], str]] = {
    "unfenced_writer_at_commit": lambda t: f"SELECT {_record(t)}",
    "unfenced_overflow_at_commit": lambda t: (
        "DO $$ BEGIN FOR i IN 1..51 LOOP"
        " PERFORM pg_catalog.set_config('application_name', 'canary-' || i, true);"
        f" PERFORM {_record(t)}; END LOOP; END $$"
    ),
    "unfenced_log_commit_marker": lambda t: (
        f"COMMIT; BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT {_record(t)}"
    ),
}


def definer_calls(proname: str, returns_trigger: bool) -> list[str] | None:
    """The statements that call a definer function on every target; None: no builder."""
    if proname in COMMIT_TRIGGER_CALLS:
        return [COMMIT_TRIGGER_CALLS[proname](t) for t in TARGETS]
    if returns_trigger:
        return []  # a trigger function runs from its triggers: the trigger cells
    if proname in LEASE_CALLS:
        return [f"SELECT {LEASE_CALLS[proname]}"]
    if proname in EVENT_CALLS:
        return [EVENT_CALLS[proname](t) for t in TARGETS]
    if proname not in DEFINER_ARGS:
        return None
    build = DEFINER_ARGS[proname]
    assert build is not None
    return [f"SELECT fencekit.{proname}({', '.join(build(t))})" for t in TARGETS]


# -------------------------------------------------------------- generated triggers

#: tgtype bits -> a statement that fires the trigger, written by the writer under a token.
_EVENTS = {4: "INSERT", 8: "DELETE", 16: "UPDATE", 32: "TRUNCATE"}


def trigger_writes(table: str, tgtype: int) -> list[str]:
    out = []
    for bit, event in _EVENTS.items():
        if not tgtype & bit:
            continue
        if event == "INSERT":
            out.append(f"INSERT INTO {table} (id, k) VALUES (900, 1)")
        elif event == "UPDATE":
            out.append(f"UPDATE {table} SET v = v + 1 WHERE id = 1")
        elif event == "DELETE":
            out.append(f"DELETE FROM {table} WHERE id = 3")
        else:
            out.append(f"TRUNCATE {table} CASCADE")
    return out


# -------------------------------------------------------------- CLI commands
# command path -> (planted, dsn) -> argv lists (each run as its own invocation).

CliArgs = Callable[[str], list[list[str]]]


def _tables(
    dsn: str, cmd: list[str], extra: Callable[[Table], list[str]] | None = None
) -> list[list[str]]:
    return [[*cmd, f"app.{t.name}", "--dsn", dsn, *(extra(t) if extra else [])] for t in TARGETS]


def _scope_args(t: Table) -> list[str]:
    s = spec_of(t)
    out = ["--scope", str(s.scope)]
    for k in s.key:
        out += ["--key", k]
    return out


def _move_args(t: Table) -> list[str]:
    # every move changes the scope: row <-> key, table -> key
    if t.scope == "key":
        return ["--scope", "row"]
    return ["--scope", "key", "--key", "k"]


CLI_ARGS: dict[str, CliArgs] = {
    "install": lambda dsn: [["install", "--dsn", dsn]],
    "uninstall": lambda dsn: [["uninstall", "--dsn", dsn, "--unprotect-all"]],
    "protect": lambda dsn: (
        [["protect", f"app.{t.name}", "--dsn", dsn, *_scope_args(t)] for t in UNPROTECTED]
        + _tables(dsn, ["protect"], _scope_args)
    ),
    "unprotect": lambda dsn: _tables(dsn, ["unprotect"]),
    "rename": lambda dsn: [
        ["rename", f"app.{t.name}", f"app.{t.name}_renamed", "--dsn", dsn] for t in TARGETS
    ],
    "auto-cover": lambda dsn: [
        ["auto-cover", "on", "--dsn", dsn],
        ["auto-cover", "off", "--dsn", dsn],
    ],
    "status": lambda dsn: [["status", "--dsn", dsn], ["status", "--json", "--dsn", dsn]],
    "allow": lambda dsn: [["allow", "--list", "--dsn", dsn, "0" * 64]],
    "rollout": lambda dsn: [["rollout", "--dsn", dsn], ["rollout", "--json", "--dsn", dsn]],
    "enforce": lambda dsn: _tables(dsn, ["enforce"]),
    "move": lambda dsn: _tables(dsn, ["move"], _move_args),
    "fences": lambda dsn: _tables(dsn, ["fences"]),
    "fence set": lambda dsn: _tables(
        dsn,
        ["fence", "set"],
        lambda t: ["--to", "50", *(["--key", "1"] if t.scope == "key" else [])],
    ),
    "sql move": lambda dsn: _tables(dsn, ["sql", "move"], _move_args),
    # These read no database: they print SQL or work on files. Run offline, they must still
    # run nothing of the owner's (they cannot: no connection).
    "sql install": lambda dsn: [["sql", "install"]],
    "sql protect": lambda dsn: [["sql", "protect", "app.t_row"]],
    "sql unprotect": lambda dsn: [["sql", "unprotect", "app.t_row"]],
    "sql rename": lambda dsn: [["sql", "rename", "app.t_row", "app.t_row2"]],
    "sql uninstall": lambda dsn: [["sql", "uninstall"]],
    "monitoring": lambda dsn: [["monitoring", "/dev/null"]],
    "alembic init": lambda dsn: [_alembic_init()],
    "chaos check": lambda dsn: [["chaos", "check", _empty_file()]],
    # demo and bench make and write tables of their own; bench runs its shortest group
    "demo": lambda dsn: [["demo", "--dsn", dsn]],
    # dev-server starts a server of its own and reads no database it is given: stopping one
    # that is not running is its whole path against an existing installation.
    "dev-server": lambda dsn: [["dev-server", "--stop", "--data-dir", _empty_dir()]],
    "bench": lambda dsn: [["bench", "--quick", "--only", "leases", "--dsn", dsn]],
}


#: Commands that change nothing in the database: they share one copy of it per role.
READ_ONLY = frozenset(
    {
        "status",
        "allow",
        "fences",
        "sql move",
        "sql install",
        "sql protect",
        "sql unprotect",
        "sql rename",
        "sql uninstall",
        "monitoring",
        "alembic init",
        "chaos check",
        "dev-server",
    }
)


def _alembic_init() -> list[str]:
    where = tempfile.mkdtemp()
    return ["alembic", "init", f"{where}/migrations", "-c", f"{where}/alembic.ini"]


def _empty_file() -> str:
    fd, path = tempfile.mkstemp(suffix=".jsonl")
    os.close(fd)
    return path


def _empty_dir() -> str:
    return tempfile.mkdtemp(prefix="fk-canary-devserver-")


def cli_commands() -> list[str]:
    """Every leaf command of the CLI's own parser."""
    import argparse

    from fencekit.cli import build_parser

    out: list[str] = []

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            out.append(" ".join(path))
            return
        for s in subs:
            for name, sp in s.choices.items():
                walk(sp, [*path, name])

    walk(build_parser(), [])
    return out
