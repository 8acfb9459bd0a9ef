"""``fencekit rename``: move a protection to its table's new name after ALTER TABLE ... RENAME
(the script ``fencekit sql rename`` prints)."""

from __future__ import annotations

import argparse
from typing import Any

from fencekit import sqlgen
from fencekit.cli.common import (
    FMT,
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
from fencekit.spec import TableName

__all__: list[str] = []


def register(subparsers: Any) -> None:
    """Add ``fencekit rename``."""
    p = subparsers.add_parser(
        "rename",
        help="move a protection to its table's new name after ALTER TABLE ... RENAME",
        formatter_class=FMT,
        description="After `ALTER TABLE OLD RENAME TO NEW` (or alembic's op.rename_table) the "
        "table's triggers keep checking writes, but the registry still names OLD, the "
        "triggers and functions are named after OLD and an unnamed key or table fence's "
        "resource is OLD's name; `fencekit status` reports the table as renamed. This moves the "
        "protection to NEW in one transaction (the table is never unchecked): registry row, "
        "triggers and functions (named after NEW), rejection counters, and the fences of an "
        "unnamed key or table fence. It refuses unless NEW carries OLD's triggers.",
        epilog="example:\n  psql -c 'ALTER TABLE billing RENAME TO invoices'\n"
        '  fencekit rename billing invoices --dsn "$DSN"',
    )
    p.add_argument("old", metavar="OLD", help="the name the table was protected under")
    p.add_argument("new", metavar="NEW", help="its name now (same schema as OLD by default)")
    lock_timeout_option(p)
    dsn_option(p)
    json_option(p)
    p.set_defaults(func=run_rename, prog=p.prog)


def run_rename(args: argparse.Namespace) -> int:
    from fencekit import catalog

    dsn, lock_timeout = dsn_from(args), lock_timeout_from(args)
    old = parse_table(args.old)
    with connect(dsn) as conn:
        catalog.require_core(conn)
        found = catalog.resolve_table(conn, args.new)
        if found is None:
            raise catalog.CatalogError(
                f"table {args.new} does not exist (search_path: {catalog.search_path(conn)}); "
                f"rename the table first: ALTER TABLE {old} RENAME TO ..."
            )
        new = found[0]
        # Unqualified OLD: the schema NEW is in (ALTER TABLE ... RENAME keeps the schema).
        old = TableName.parse(args.old, default_schema=new.schema)
        pt = catalog.registered(conn, old)
        if pt is None:
            raise catalog.CatalogError(
                f"{old} is not protected (fencekit.protected has no row for it)"
            )
        if new == old:
            raise catalog.CatalogError(f"{old} still exists under that name: nothing to rename")
        script = sqlgen.render_rename(pt.spec, new, lock_timeout=lock_timeout)
        run_script(conn, script, lock_timeout)
    spec = pt.spec.with_changes(table=new)
    document = {
        "action": "rename",
        "old": table_keys(pt.spec),
        **table_keys(spec),
        "template_version": sqlgen.TEMPLATE_VERSION,
    }
    emit(args, document, [f"renamed the protection of {old} to {new} ({spec.describe()})"])
    return 0
