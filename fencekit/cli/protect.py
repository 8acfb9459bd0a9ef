"""``fencekit protect``: check a table in the database, then run the script ``fencekit sql
protect`` prints for the same options."""

from __future__ import annotations

import argparse
from typing import Any

from fencekit import sqlgen
from fencekit.catalog.model import Drift
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
from fencekit.cli.hints import command_text, fix_text

__all__ = ["register", "run_protect"]

_ALLOWED_NOTE = "allowed when the table was protected (fencekit protect --allow-existing-code)"


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
    p.add_argument(
        "--allow-existing-code",
        action="store_true",
        help="after protecting, allow (by hash, as `fencekit allow` does) the code of the "
        "table's owner that fires on it now: triggers, foreign-key cascades, defaults... "
        "Use it once you have reviewed that code; a later change to it is reported again",
    )
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
        owner_code, allowed = _owner_code(conn, spec, args.allow_existing_code)
    document = {
        "action": "protect",
        **table_keys(spec),
        "template_version": sqlgen.TEMPLATE_VERSION,
        "notes": notes,
        "owner_code": [d.as_dict(command_text) for d in owner_code],
        "allowed": allowed,
    }
    text = [f"protected {spec.table} ({spec.describe()}, template {sqlgen.TEMPLATE_VERSION})"]
    text += _owner_code_text(owner_code, allowed)
    emit(args, document, text)
    if not args.json:
        for note in notes:
            print_note(args, note)
    return 0


def _owner_code(conn: Any, spec: Any, allow: bool) -> tuple[list[Drift], dict[str, str]]:
    """The code of the table's owner that fires on the table now, as ``fencekit status``
    reports it (``status`` exits 1 for each until it is allowed), and what ``allow`` allowed."""
    from fencekit import catalog

    st = catalog.status(conn)
    found = [
        d for t in st.tables if t.spec.table == spec.table for d in t.drift if d.sha256 is not None
    ]
    allowed: dict[str, str] = {}
    if allow and found:
        allowed = catalog.allow_code(conn, st, sorted({d.sha256 for d in found if d.sha256}),
                                     _ALLOWED_NOTE)  # fmt: skip
    return found, allowed


def _owner_code_text(found: list[Drift], allowed: dict[str, str]) -> list[str]:
    if not found:
        return []
    lines = [
        f"code of the table's owner already fires on it ({len(found)}): fencekit status "
        "reports each until it is allowed. What each means for the fence:"
    ]
    for d in found:
        lines.append(f"  [{d.kind.value}] {d.object}: {d.message}")
        if d.sha256 in allowed:
            lines.append(f"    allowed {d.sha256}")
        else:
            lines.extend(f"    {line}" for line in fix_text(d).splitlines())
    if not allowed:
        lines.append(
            "once reviewed, allow them all: re-run with --allow-existing-code "
            "(or fencekit allow SHA256 for each)"
        )
    return lines
