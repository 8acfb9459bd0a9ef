"""``fencekit sql install|protect|unprotect|rename|uninstall``: print the scripts the live
commands run, for review and psql. No database is needed (``--from-ddl`` validates against schema
files). ``fencekit sql move`` is added by :mod:`fencekit.cli.move`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from fencekit import sqlgen
from fencekit.cli.common import (
    FMT,
    TABLE_HELP,
    lock_timeout_from,
    lock_timeout_option,
    parse_table,
    print_note,
    spec_from,
    spec_options,
)
from fencekit.errors import SpecError, UsageError
from fencekit.spec import FenceSpec, TableName

__all__: list[str] = []


def register(subparsers: Any) -> None:
    """Add ``fencekit sql`` and its scripts install, protect, unprotect, rename and uninstall."""
    p = subparsers.add_parser(
        "sql",
        help="print reviewable SQL scripts (install, protect, unprotect) for psql",
        formatter_class=FMT,
        description="Print SQL scripts for a DBA to review and run with psql. No database "
        "connection is needed.",
        epilog="examples:\n"
        "  fencekit sql install > fencekit.sql\n"
        "  fencekit sql protect billing_summary --key account_id > protect.sql\n"
        "  psql -v ON_ERROR_STOP=1 -f protect.sql",
    )
    commands = p.add_subparsers(dest="sql_command", metavar="SCRIPT", required=True)
    inst = commands.add_parser(
        "install",
        help="the core install script",
        formatter_class=FMT,
        description="Print the core install script (the same SQL `fencekit install` runs; "
        "sql/fencekit-install.sql in the source tree is a copy of it). It runs in one "
        "transaction and is idempotent.",
        epilog="example:\n"
        "  fencekit sql install > fencekit.sql && psql -v ON_ERROR_STOP=1 -f fencekit.sql",
    )
    lock_timeout_option(inst)
    _no_transaction_option(inst)
    inst.set_defaults(func=run_sql_install, prog=inst.prog)

    prot = commands.add_parser(
        "protect",
        help="the script that protects a table",
        formatter_class=FMT,
        description="Print the script that protects TABLE: the fence column (row fences), the "
        "check functions and triggers, and the registry row, in one transaction with a "
        "lock_timeout. It adds a nullable column at most (no table rewrite) and is "
        "idempotent.\n\nScopes: row (default; each row carries its fence), key (--key: rows "
        "sharing key values share one fence; --resource shares it across tables), table (one "
        "fence for the whole table).\n\nWith --from-ddl the table and key columns are checked "
        "against CREATE/ALTER TABLE statements in the given files, offline.",
        epilog="examples:\n"
        "  fencekit sql protect billing_summary > protect.sql\n"
        "  fencekit sql protect public.billing_summary --key account_id "
        "--from-ddl schema.sql\n"
        "  fencekit sql protect invoices --key account_id --resource billing\n"
        '  fencekit sql protect \'"My Schema"."Ledger"\' --scope table --on-equal reject',
    )
    prot.add_argument("table", metavar="TABLE", help=TABLE_HELP)
    spec_options(prot, from_ddl=True)
    _no_transaction_option(prot)
    prot.set_defaults(func=run_sql_protect, prog=prot.prog)

    unprot = commands.add_parser(
        "unprotect",
        help="the exact undo of `sql protect` for the same options",
        formatter_class=FMT,
        description="Print the script that removes what `fencekit sql protect` with the same "
        "options created: triggers (also on partitions), functions, the fence column of a row "
        "fence (its fences are lost), counters and the registry row. Pass the options the "
        "table was protected with (`fencekit status` shows them); `fencekit unprotect --dsn` "
        "reads them from the database instead.",
        epilog="example:\n  fencekit sql unprotect billing_summary --key account_id > undo.sql",
    )
    unprot.add_argument("table", metavar="TABLE", help=TABLE_HELP)
    spec_options(unprot, from_ddl=True)
    _no_transaction_option(unprot)
    unprot.set_defaults(func=run_sql_unprotect, prog=unprot.prog)
    _sql_rename(commands)
    _sql_uninstall(commands)


def _no_transaction_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-transaction",
        dest="transaction",
        action="store_false",
        help="leave out BEGIN/COMMIT and the lock_timeout, to run the statements inside a "
        "transaction someone else opens (a Django RunSQL, a migration tool's transaction)",
    )


def _sql_rename(commands: Any) -> None:
    p = commands.add_parser(
        "rename",
        help="the script that moves a protection to a renamed table's new name",
        formatter_class=FMT,
        description="Print the script `fencekit rename` runs: after `ALTER TABLE OLD RENAME TO "
        "NEW`, move OLD's protection (registry row, triggers and functions, counters, an "
        "unnamed key or table fence's fences) to NEW in one transaction. Pass the options OLD "
        "was protected with (`fencekit status` shows them); the script refuses to run when "
        "the registry holds another spec, naming the right command.",
        epilog="example:\n  fencekit sql rename billing invoices --key account_id > rename.sql",
    )
    p.add_argument("table", metavar="OLD", help="the name the table was protected under")
    p.add_argument("new", metavar="NEW", help="its name now (same schema as OLD by default)")
    spec_options(p, from_ddl=False)
    p.set_defaults(func=run_sql_rename, prog=p.prog)


def _sql_uninstall(commands: Any) -> None:
    p = commands.add_parser(
        "uninstall",
        help="the script that removes fencekit from a database",
        formatter_class=FMT,
        description="Print the script `fencekit uninstall` runs. It refuses while tables are "
        "protected, unless --unprotect-all: then it first removes, for every table in "
        "fencekit.protected, its fencekit triggers (also on partitions and children) and a "
        "row fence's column, with the fences they hold.",
        epilog="example:\n  fencekit sql uninstall > uninstall.sql && "
        "psql -v ON_ERROR_STOP=1 -f uninstall.sql",
    )
    p.add_argument(
        "--unprotect-all",
        action="store_true",
        help="unprotect every protected table first (their fences are lost)",
    )
    lock_timeout_option(p)
    p.set_defaults(func=run_sql_uninstall, prog=p.prog)


def run_sql_install(args: argparse.Namespace) -> int:
    script = sqlgen.render_install(
        lock_timeout=lock_timeout_from(args), transaction=args.transaction
    )
    sys.stdout.write(script)
    return 0


def _print_table_script(args: argparse.Namespace, render: Callable[..., str]) -> int:
    spec = spec_from(args, parse_table(args.table))
    _offline_check(args, spec)
    script = render(spec, lock_timeout=lock_timeout_from(args), transaction=args.transaction)
    sys.stdout.write(script)
    return 0


def _offline_check(args: argparse.Namespace, spec: FenceSpec) -> None:
    if not args.from_ddl:
        return
    from fencekit import ddl

    for note in ddl.validate(spec, ddl.read_ddl(args.from_ddl)):
        print_note(args, note)


def run_sql_protect(args: argparse.Namespace) -> int:
    return _print_table_script(args, sqlgen.render_protect)


def run_sql_unprotect(args: argparse.Namespace) -> int:
    return _print_table_script(args, sqlgen.render_unprotect)


def _new_name(old: TableName, text: str) -> TableName:
    """NEW as written; unqualified, it stays in OLD's schema (RENAME keeps the schema)."""
    try:
        return TableName.parse(text, default_schema=old.schema)
    except SpecError as exc:
        raise UsageError(str(exc)) from None


def run_sql_rename(args: argparse.Namespace) -> int:
    old = parse_table(args.table)
    spec = spec_from(args, old)
    new = _new_name(old, args.new)
    if new == old:
        raise UsageError(f"OLD and NEW are the same table ({old})")
    sys.stdout.write(sqlgen.render_rename(spec, new, lock_timeout=lock_timeout_from(args)))
    return 0


def run_sql_uninstall(args: argparse.Namespace) -> int:
    script = sqlgen.render_uninstall(
        unprotect_all=args.unprotect_all, lock_timeout=lock_timeout_from(args)
    )
    sys.stdout.write(script)
    return 0
