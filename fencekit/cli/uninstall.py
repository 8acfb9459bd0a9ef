"""``fencekit uninstall``: remove fencekit from a database (the script ``fencekit sql
uninstall`` prints), refusing while tables are protected unless --unprotect-all."""

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
    run_script,
)

__all__: list[str] = []


def register(subparsers: Any) -> None:
    """Add ``fencekit uninstall``."""
    p = subparsers.add_parser(
        "uninstall",
        help="remove fencekit from a database (refuses while tables are protected)",
        formatter_class=FMT,
        description="Drop the schema fencekit: the registry, the fences, the counters, the "
        "leases and every check function. Refuses while tables are protected (nothing is "
        "changed) unless --unprotect-all: then each protected table is first unprotected "
        "exactly as `fencekit unprotect` would (triggers dropped, a row fence's column "
        "dropped with its fences), all in one transaction. The roles fencekit_admin and "
        "fencekit_writer stay (roles belong to the whole server). If auto-cover is on, "
        "removing its event trigger needs a superuser.",
        epilog='examples:\n  fencekit uninstall --dsn "$DSN"\n'
        '  fencekit uninstall --unprotect-all --dsn "$DSN"',
    )
    p.add_argument(
        "--unprotect-all",
        action="store_true",
        help="unprotect every protected table first (their fences are lost)",
    )
    lock_timeout_option(p)
    dsn_option(p)
    json_option(p)
    p.set_defaults(func=run_uninstall, prog=p.prog)


def run_uninstall(args: argparse.Namespace) -> int:
    from fencekit import catalog

    dsn, lock_timeout = dsn_from(args), lock_timeout_from(args)
    with connect(dsn) as conn:
        before = catalog.core_version(conn)
        if before is None:
            emit(
                args,
                {"action": "uninstall", "core_version_before": None, "unprotected": []},
                ["fencekit is not installed in this database; nothing to remove"],
            )
            return 0
        tables = catalog.protected_tables(conn)
        if tables and not args.unprotect_all:
            names = ", ".join(str(pt.spec.table) for pt in tables)
            raise catalog.CatalogError(
                f"{len(tables)} table(s) are still protected ({names}); nothing was removed. "
                "Unprotect them (fencekit unprotect TABLE), or pass --unprotect-all to "
                "unprotect them in the same transaction (their fences are lost)"
            )
        specs = [pt.spec for pt in tables]
        script = sqlgen.render_uninstall(specs, lock_timeout=lock_timeout)
        run_script(conn, script, lock_timeout)
    document = {
        "action": "uninstall",
        "core_version_before": before,
        "unprotected": [spec.table.dotted for spec in specs],
    }
    text = [f"unprotected {spec.table}" for spec in specs]
    text.append(
        f"removed fencekit (core version {before}); roles fencekit_admin and fencekit_writer remain"
    )
    emit(args, document, text)
    return 0
