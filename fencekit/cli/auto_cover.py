"""``fencekit auto-cover on|off``: the event trigger that covers partitions and children
created after protect."""

from __future__ import annotations

import argparse
from typing import Any

from fencekit.cli.common import FMT, connect, dsn_from, dsn_option

__all__: list[str] = []


def register(subparsers: Any) -> None:
    """Add ``fencekit auto-cover``."""
    p = subparsers.add_parser(
        "auto-cover",
        help="cover partitions and children created after protect, as they are created",
        formatter_class=FMT,
        description="Protect puts a table's triggers on the partitions and inheritance "
        "children it has when it runs. A child created or attached later is not covered until "
        "protect is re-run (`fencekit status` reports it). `auto-cover on` installs an event "
        "trigger that covers such a child in the transaction that creates it (CREATE TABLE, "
        "ALTER TABLE, and the CREATE TABLE elements of CREATE SCHEMA), or refuses to "
        "create it when the creating role may not attach fencekit's triggers. Event triggers "
        "need a superuser (or your provider's equivalent role).",
        epilog="examples:\n  fencekit auto-cover on --dsn postgresql://admin@db/app\n"
        "  fencekit auto-cover off --dsn postgresql://admin@db/app",
    )
    p.add_argument("state", choices=["on", "off"], help="turn auto-cover on or off")
    dsn_option(p)
    p.set_defaults(func=run_auto_cover, prog=p.prog)


def run_auto_cover(args: argparse.Namespace) -> int:
    from fencekit import catalog

    with connect(dsn_from(args)) as conn:
        catalog.require_core(conn)
        conn.execute("SELECT fencekit.set_auto_cover(%s)", [args.state == "on"])
        conn.commit()
    print(f"auto-cover is {args.state}")
    return 0
