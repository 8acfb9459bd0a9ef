"""``fencekit unprotect``: run the exact undo of the spec and template a table was protected
with, read from fencekit.protected."""

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
    lock_timeout_option,
    parse_table,
    run_script,
    table_keys,
)

__all__: list[str] = []


def register(subparsers: Any) -> None:
    """Add ``fencekit unprotect``."""
    p = subparsers.add_parser(
        "unprotect",
        help="remove fencekit's objects from a table in a live database",
        formatter_class=FMT,
        description="Read the spec and template version TABLE was protected with from "
        "fencekit.protected and run their exact undo (see `fencekit sql unprotect`). A row "
        "fence's column is dropped with the fences it holds.",
        epilog='example:\n  fencekit unprotect billing_summary --dsn "$DSN"',
    )
    p.add_argument("table", metavar="TABLE", help=TABLE_HELP)
    lock_timeout_option(p)
    dsn_option(p)
    json_option(p)
    p.set_defaults(func=run_unprotect, prog=p.prog)


def run_unprotect(args: argparse.Namespace) -> int:
    from fencekit import catalog

    dsn, lock_timeout = dsn_from(args), lock_timeout_from(args)
    parse_table(args.table)
    with connect(dsn) as conn:
        if catalog.core_version(conn) is None:
            catalog.require_core(conn)
        pt = catalog.protected_table(conn, args.table, "fencekit.protected has no row for it")
        script = sqlgen.render_unprotect(pt.spec, lock_timeout=lock_timeout)
        run_script(conn, script, lock_timeout)
    document = {
        "action": "unprotect",
        **table_keys(pt.spec),
        "template_version": pt.template_version,
    }
    emit(args, document, [f"unprotected {pt.spec.table} (was: {pt.spec.describe()})"])
    return 0
