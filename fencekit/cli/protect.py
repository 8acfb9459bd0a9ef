"""``fencekit protect``: check a table in the database, then run the script ``fencekit sql
protect`` prints for the same options."""

from __future__ import annotations

import argparse
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

__all__: list[str] = []


def register(subparsers: Any) -> None:
    """Add ``fencekit protect``."""
    p = subparsers.add_parser(
        "protect",
        help="protect a table in a live database (runs `fencekit sql protect`'s script)",
        formatter_class=FMT,
        description="Check TABLE in the database (it exists, key columns exist and are NOT "
        "NULL, the fence column is free or bigint, the core is installed), then run the "
        "script `fencekit sql protect` prints for the same options. An unqualified TABLE is "
        "resolved through the server's search_path. Re-running it is a no-op that also "
        "repairs missing triggers and partitions attached since.",
        epilog="examples:\n"
        '  fencekit protect billing_summary --dsn "$DSN"\n'
        "  FENCEKIT_DSN=postgresql:///billing fencekit protect billing_summary --key account_id",
    )
    p.add_argument("table", metavar="TABLE", help=TABLE_HELP)
    spec_options(p, from_ddl=False)
    dsn_option(p)
    json_option(p)
    p.set_defaults(func=run_protect, prog=p.prog)


def run_protect(args: argparse.Namespace) -> int:
    from fencekit import catalog

    dsn, lock_timeout = dsn_from(args), lock_timeout_from(args)
    spec_from(args, parse_table(args.table))  # usage errors before connecting
    with connect(dsn) as conn:
        catalog.require_core(conn)
        spec = spec_from(args, catalog.existing_table(conn, args.table))
        notes = catalog.check_spec(conn, spec)
        script = sqlgen.render_protect(spec, lock_timeout=lock_timeout)
        run_script(conn, script, lock_timeout)
    document = {
        "action": "protect",
        **table_keys(spec),
        "template_version": sqlgen.TEMPLATE_VERSION,
        "notes": notes,
    }
    text = [f"protected {spec.table} ({spec.describe()}, template {sqlgen.TEMPLATE_VERSION})"]
    emit(args, document, text)
    if not args.json:
        for note in notes:
            print_note(args, note)
    return 0
