"""``fencekit install``: install or upgrade the core in a database (the script ``fencekit sql
install`` prints), re-protecting tables whose objects an older template generated."""

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
from fencekit.ident import quote_literal
from fencekit.sqlgen.pin import SCRIPT_PIN

__all__: list[str] = []


def register(subparsers: Any) -> None:
    """Add ``fencekit install``."""
    p = subparsers.add_parser(
        "install",
        help="install (or upgrade) fencekit's core objects in a database",
        formatter_class=FMT,
        description="Install fencekit's core (schema fencekit, the fences and registry tables, "
        "the check functions, the rejection counters and the role fencekit_admin) into the "
        "database. Idempotent: re-running it, or running a newer fencekit, upgrades in place "
        "without touching protected tables.\n\nNeeds CREATE on the database (and CREATEROLE "
        "once, unless a DBA created the role fencekit_admin beforehand). With no Python near "
        "the server, use `fencekit sql install` and psql instead.",
        epilog="example:\n  fencekit install --dsn postgresql://app@db.example/billing",
    )
    dsn_option(p)
    lock_timeout_option(p)
    p.add_argument(
        "--allow-untested-postgres",
        action="store_true",
        help="install even on a PostgreSQL major version this fencekit is not tested on "
        "(tested: 14 to 18); without it, install refuses such a server and changes nothing",
    )
    json_option(p)
    p.set_defaults(func=run_install, prog=p.prog)


def run_install(args: argparse.Namespace) -> int:
    from fencekit.catalog import core_version, protected_tables

    dsn, lock_timeout = dsn_from(args), lock_timeout_from(args)
    with connect(dsn) as conn:
        before = core_version(conn)
        # Tables protected by another generation of per-table objects are re-protected in the
        # same transaction as the core upgrade: their old functions may call core functions the
        # upgrade replaced, so they must never run against the new core.
        outdated = (
            []
            if before is None
            else [
                pt.spec
                for pt in protected_tables(conn)
                if pt.template_version != sqlgen.TEMPLATE_VERSION
            ]
        )
        conn.rollback()
        statements = sqlgen.install_statements()
        for spec in outdated:
            statements += sqlgen.protect_statements(spec)
        # fencekit.check_postgres_version (core) reads this setting.
        untested = (
            "SET LOCAL fencekit.allow_untested_postgres = on;\n"
            if getattr(args, "allow_untested_postgres", False)
            else ""
        )
        script = (
            f"BEGIN;\nSET LOCAL lock_timeout = {quote_literal(lock_timeout)};\n"
            f"{SCRIPT_PIN};\n{untested}"
            + ";\n".join(s.rstrip().rstrip(";") for s in statements)
            + ";\nCOMMIT;\n"
        )
        run_script(conn, script, lock_timeout)
        after = core_version(conn)
    if before is None:
        text = [f"installed fencekit core version {after}"]
    elif before == after:
        text = [f"fencekit core version {after} was already installed; re-applied (no changes)"]
    else:
        text = [f"upgraded fencekit core from version {before} to {after}"]
    text += [
        f"re-protected {spec.table} with template {sqlgen.TEMPLATE_VERSION}" for spec in outdated
    ]
    document = {
        "action": "install",
        "core_version_before": before,
        "core_version": after,
        "template_version": sqlgen.TEMPLATE_VERSION,
        "reprotected": [spec.table.dotted for spec in outdated],
    }
    emit(args, document, text)
    return 0
