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

__all__: list[str] = []

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
        notes = catalog.check_spec(conn, spec) + _earlier_table_notes(conn, spec)
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


def _earlier_table_notes(conn: Any, spec: Any) -> list[str]:
    """What an earlier table of the same name left: a registry entry whose triggers this table
    does not carry (dropped and created again where the event trigger that forgets dropped
    tables is not installed), or, for a table not registered, fences of its resource."""
    objs = sqlgen.table_objects(spec)
    t = spec.table
    row = conn.execute(
        "SELECT p.tag, NOT EXISTS (SELECT FROM pg_catalog.pg_trigger g "
        "  WHERE g.tgrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(%s) "
        "    AND g.tgname::pg_catalog.text OPERATOR(pg_catalog.=) ANY (%s)) "
        "FROM fencekit.protected p "
        "WHERE p.schema_name OPERATOR(pg_catalog.=) %s AND p.table_name OPERATOR(pg_catalog.=) %s",
        (t.sql, [tr.name for tr in objs.triggers], t.schema, t.name),
    ).fetchone()
    if row is not None:
        if not row[1]:
            return []
        return [
            f"{t} is in fencekit's registry but carries none of its triggers: it was dropped and "
            "created again without fencekit forgetting it (the event trigger that forgets "
            "dropped tables needs a superuser and may not be installed, and it forgets nothing "
            "while another table has the registered name) or its triggers were dropped. This "
            "protect keeps the registry entry and its counters; to start afresh, unprotect it "
            "first (fencekit unprotect TABLE), then protect it"
        ]
    if spec.resource is not None:
        return []
    fenced = conn.execute(
        "SELECT CASE WHEN pg_catalog.has_function_privilege('fencekit.max_fence(text)', "
        "'EXECUTE') THEN fencekit.max_fence(%s) IS NOT NULL END",
        (spec.resource_name,),
    ).fetchone()
    if fenced and fenced[0]:
        return [
            f"{t} is protected afresh, but its resource {spec.resource_name!r} keeps the fences "
            "an earlier table of that name left (a fence is never lowered): a write needs a "
            "token above them, as every later token of fencekit's issuer is"
        ]
    return []
