"""``fencekit move`` and ``fencekit sql move``: change a protected table's spec in one
transaction, its fences carried over (see :mod:`fencekit.sqlgen.move`)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Any

from fencekit import sqlgen
from fencekit.cli.common import (
    FMT,
    TABLE_HELP,
    connect,
    dsn_from,
    dsn_option,
    emit,
    json_option,
    lock_timeout_from,
    parse_table,
    print_note,
    run_script,
    spec_from,
    spec_options,
    table_keys,
)
from fencekit.errors import UsageError
from fencekit.spec import FenceSpec, TableName

__all__: list[str] = []

_CARRIED = (
    "Fences are carried conservatively: no row or key ends up below a token the old spec "
    "accepted for it (row -> key: a key takes the highest fence of its rows; key or row -> "
    "table: the highest fence; key or table -> row: each row its key's fence, or the table "
    "fence; table -> key: every key starts at the table fence; other key columns: a new key "
    "takes the highest fence of the old keys it covers). Policies alone (--on-missing, "
    "--on-equal, --issuer) change in place, as re-running protect does. See docs/dba-guide.md, "
    '"Change a protection".'
)


def register(subparsers: Any) -> None:
    """Add ``fencekit move`` and ``fencekit sql move``."""
    p = subparsers.add_parser(
        "move",
        help="change a protected table's scope, key, resource or fence column, fences kept",
        formatter_class=FMT,
        description="Move TABLE from the spec it is protected with (read from fencekit.protected) "
        "to the spec the options describe, in one transaction: it locks the table (and the "
        "tables sharing its resource) against writers, removes the old triggers, carries the "
        "fences over, creates the new triggers and commits. The table is never unprotected: a "
        "writer waits for the move (or gives up on its lock_timeout), then meets the new "
        "fence.\n\nThe options describe the new spec in full, as for `fencekit protect`: an "
        "option left out takes its default.\n\n" + _CARRIED,
        epilog="examples:\n"
        '  fencekit move billing_summary --key account_id --dsn "$DSN"\n'
        '  fencekit move invoices --key account_id --resource billing --dsn "$DSN"\n'
        '  fencekit move ledger --scope table --dsn "$DSN"',
    )
    p.add_argument("table", metavar="TABLE", help=TABLE_HELP)
    spec_options(p, from_ddl=False)
    dsn_option(p)
    json_option(p)
    p.set_defaults(func=run_move, prog=p.prog)
    _register_sql(subparsers)


def _register_sql(subparsers: Any) -> None:
    """``fencekit sql move``, under the ``sql`` command that the core group made."""
    sql = subparsers.choices.get("sql")
    if sql is None:
        return
    commands = next(
        a
        for a in sql._actions
        if isinstance(a, argparse._SubParsersAction)  # noqa: SLF001
    )
    p = commands.add_parser(
        "move",
        help="the script that moves a table to another spec, fences kept",
        formatter_class=FMT,
        description="Print the script `fencekit move` runs, for review and psql. The spec the "
        "table is protected with now comes from the database (--dsn: read-only) or from "
        "--from, written as the options of `fencekit sql protect` (`fencekit status` shows "
        "them). The script refuses to run, changing nothing, when the registry holds another "
        "spec.\n\n" + _CARRIED,
        epilog="examples:\n"
        '  fencekit sql move billing_summary --key account_id --dsn "$DSN" > move.sql\n'
        "  fencekit sql move billing_summary --key account_id --from='' > move.sql"
        "   # now a row fence\n"
        "  fencekit sql move ledger --scope table --from='--key account_id' > move.sql\n"
        "  psql -v ON_ERROR_STOP=1 -f move.sql",
    )
    p.add_argument("table", metavar="TABLE", help=TABLE_HELP)
    spec_options(p, from_ddl=False)
    p.add_argument(
        "--from",
        dest="from_options",
        metavar="OPTIONS",
        help="the options TABLE is protected with now, as one shell word: --from='' for a "
        "default row fence, --from='--key account_id', --from='--scope table --resource "
        "billing' (instead of --dsn)",
    )
    dsn_option(p)
    p.set_defaults(func=run_sql_move, prog=p.prog)


def _old_from_options(table: TableName, text: str) -> FenceSpec:
    """The old spec from ``--from``: protect's options, parsed by protect's own parser."""
    parser = argparse.ArgumentParser(prog="fencekit sql move --from", add_help=False)
    spec_options(parser, from_ddl=False)
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"--from {text!r}: {exc}") from None
    try:
        parsed, extra = parser.parse_known_args(words)
    except SystemExit:
        raise UsageError(f"--from {text!r} is not a set of protect options") from None
    if extra:
        raise UsageError(f"--from: unrecognized options {' '.join(extra)}")
    return spec_from(parsed, table)


def _current(conn: Any, text: str) -> FenceSpec:
    from fencekit import catalog

    catalog.require_core(conn)
    pt = catalog.protected_table(conn, text, "protect it (fencekit protect) instead of moving it")
    return pt.spec


def run_sql_move(args: argparse.Namespace) -> int:
    table = parse_table(args.table)
    spec_from(args, table)  # usage errors first
    lock_timeout = lock_timeout_from(args)
    if args.from_options is not None and args.dsn is not None:
        raise UsageError(
            "give the current spec with --from OPTIONS or read it with --dsn, not both"
        )
    if args.from_options is not None:
        old = _old_from_options(table, args.from_options)
    else:
        if not (args.dsn or os.environ.get("FENCEKIT_DSN")):
            raise UsageError(
                "give the current spec with --from OPTIONS, or read it from the database with "
                "--dsn DSN (or FENCEKIT_DSN)"
            )
        with connect(dsn_from(args)) as conn:
            old = _current(conn, args.table)
    new = spec_from(args, old.table)
    if old == new:
        raise UsageError(f"{old.table} is protected with exactly these options: nothing to move")
    sys.stdout.write(sqlgen.render_move(old, new, lock_timeout=lock_timeout))
    return 0


def run_move(args: argparse.Namespace) -> int:
    from fencekit import catalog

    dsn, lock_timeout = dsn_from(args), lock_timeout_from(args)
    spec_from(args, parse_table(args.table))
    with connect(dsn) as conn:
        old = _current(conn, args.table)
        new = spec_from(args, old.table)
        moved = sqlgen.is_move(old, new)
        notes = [] if old == new else catalog.check_spec(conn, new, moving=True)
        if old != new:
            run_script(conn, sqlgen.render_move(old, new, lock_timeout=lock_timeout), lock_timeout)
    document = {
        "action": "move",
        **table_keys(new),
        "from": old.as_dict(),
        "moved": moved,
        "changed": old != new,
        "template_version": sqlgen.TEMPLATE_VERSION,
        "notes": notes,
    }
    if old == new:
        text = [f"{new.table} is already protected with {new.describe()}: nothing to do"]
    elif moved:
        text = [f"moved {new.table} from {old.describe()} to {new.describe()}, fences carried over"]
    else:
        text = [f"changed the policies of {new.table} in place ({new.describe()}), fences kept"]
    emit(args, document, text)
    if not args.json:
        for note in notes:
            if "policies change in place" not in note:
                print_note(args, note)
    return 0
