"""Inspect and repair fences: ``fencekit fences TABLE`` and ``fencekit fence set TABLE``.

Everything is decided in SQL: a key's text comes from ``fencekit.key_text`` (the key triggers'
expression under their pinned settings), a repair is ``fencekit.set_fence`` (which checks the
session's membership of fencekit_admin, refuses to lower a fence without ``allow_lower`` and
writes the audit row). This module only reads and prints.
"""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import TYPE_CHECKING, Any

from fencekit.cli import HelpFormatter
from fencekit.cli.common import connect, dsn_from, dsn_option, emit, json_option, parse_table
from fencekit.errors import UsageError
from fencekit.spec import Scope

if TYPE_CHECKING:
    import psycopg

    from fencekit.catalog import ProtectedTable

__all__: list[str] = []

_BIGINT_MAX = 2**63 - 1
_TABLE_HELP = 'the protected table, as SQL writes it: billing, public.billing, "My Schema"."T"'


def register(subparsers: Any) -> None:
    """Add ``fences`` and ``fence set`` to ``fencekit``."""
    _fences(subparsers)
    _fence(subparsers)


def _fences(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "fences",
        help="inspect a protected table's fences (distribution, highest, one key)",
        formatter_class=HelpFormatter,
        description="Show the fences of a protected table. Row fence: how many rows have a "
        "fence, the lowest and highest, and the rows with the highest fences (by primary key); "
        "this reads the whole table. Key and table fences: how many keys have a fence, and the "
        "keys with the highest fences with the time each last advanced, plus the table's worst "
        "lateness (how long after a fence had passed a token a writer still presented it; see "
        "docs/errors-and-metrics.md).\n\nWith --key, just that key (key fence: the key columns' "
        "values, in key-column order; row fence: the primary key's values, in index order). "
        "Values are written as SQL would write them ('2024-05-01 10:00+02', 42, 'eu') and "
        "named exactly as the key triggers name them, whatever this session's settings.\n\n"
        "Reads fencekit.fences: needs a member of fencekit_admin. A row fence's fences are the "
        "table's rows, and reading them runs the table owner's code (the planner evaluates "
        "index and statistics expressions): it runs only in a session logged in as the table's "
        "owner; any other session, a superuser's included, is refused with the command to run "
        "as the owner.",
        epilog="examples:\n"
        "  fencekit fences billing_summary\n"
        "  fencekit fences payments --key 42            # key fence on account_id\n"
        "  fencekit fences orders --key eu --key 1001   # composite key (region, order_no)\n"
        "  fencekit fences billing_summary --top 50 --json",
    )
    p.add_argument("table", metavar="TABLE", help=_TABLE_HELP)
    _key_option(p)
    p.add_argument(
        "--top",
        type=int,
        default=10,
        metavar="N",
        help="how many of the highest fences to list (default: %(default)s)",
    )
    json_option(p)
    dsn_option(p)
    p.set_defaults(func=run_fences, prog=p.prog)


def _fence(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "fence",
        help="repair a fence (fence set)",
        formatter_class=HelpFormatter,
        description="Repair fences. See: fencekit fence set --help",
    )
    commands = p.add_subparsers(dest="fence_command", metavar="COMMAND", required=True)
    s = commands.add_parser(
        "set",
        help="set one fence to a value, audited (members of fencekit_admin only)",
        formatter_class=HelpFormatter,
        description="Set the fence of one key (key fence), of the table (table fence) or of one "
        "row (row fence) to N, e.g. after a buggy writer pushed it to a token no issuer will "
        "reach. Runs fencekit.set_fence(...) in one transaction: it refuses unless the session's "
        "role is a member of fencekit_admin, refuses to lower a fence unless --allow-lower, and "
        "records the repair (who, when, table, key, old and new fence, --reason) in "
        "fencekit.repairs, which `fencekit status` summarises.\n\nLowering a fence lets through "
        "tokens it rejected: only do it when no writer holds such a token (the bad value came "
        "from a bug, not from an issuer). A key with no fence has nothing to repair and is "
        "refused.\n\nA row fence lives in the table, so its repair writes the table, and that "
        "runs the table owner's code (triggers, rules, constraints, index expressions, "
        "policies). It runs only in a session logged in as the table's owner (a member of "
        "fencekit_admin): in any other session, a superuser's included, it is refused before "
        "the table is touched, with the SQL to run as the owner. SET ROLE is not enough: the "
        "owner's code could RESET ROLE back to yours.",
        epilog="examples:\n"
        "  fencekit fence set payments --key 42 --to 35 --allow-lower \\\n"
        "      --reason 'writer sent bigint max (INC-123)'\n"
        "  fencekit fence set nightly_report --to 900          # table fence\n"
        "  fencekit fence set billing_summary --key 7 --to 40  # row fence, primary key 7",
    )
    s.add_argument("table", metavar="TABLE", help=_TABLE_HELP)
    _key_option(s)
    s.add_argument("--to", required=True, metavar="N", help="the new fence, a positive bigint")
    s.add_argument(
        "--allow-lower",
        action="store_true",
        help="allow setting a fence lower than it is (refused otherwise)",
    )
    s.add_argument("--reason", metavar="TEXT", help="why, recorded in fencekit.repairs")
    json_option(s)
    dsn_option(s)
    s.set_defaults(func=run_fence_set, prog=s.prog)


def _key_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--key",
        action="append",
        default=[],
        metavar="VALUE",
        help="a key column's value (key fence) or a primary key column's value (row fence); "
        "repeat for a composite key, in column order; none for a table fence",
    )


# ------------------------------------------------------------------------------- helpers


def _protected(conn: psycopg.Connection[Any], text: str) -> ProtectedTable:
    from fencekit import catalog

    catalog.require_core(conn)
    parse_table(text)  # a malformed name is a usage error
    pt = catalog.protected_table(conn, text, "fencekit status lists the protected tables")
    # The name must still be the protected table itself: its owner may have renamed it and put
    # a view (whose functions run as whoever reads it) under the old name. Raises (YF000,
    # naming the table it was renamed to) for anything else.
    conn.execute(
        "SELECT FROM fencekit.registered_table(%s::pg_catalog.regclass)", (pt.spec.table.sql,)
    )
    return pt


def _owner_session_only(conn: psycopg.Connection[Any], pt: ProtectedTable) -> None:
    """Refuse unless this session logged in as the table's owner (``fencekit.session_is``).

    A row fence's fences are the table's rows, and planning a read of them runs the owner's
    code (index, statistics and partition key expressions) as the reader. In the owner's own
    session it runs with the owner's rights; in an admin's or a superuser's it would run with
    theirs, and SET ROLE cannot contain it (the code can RESET ROLE)."""
    from fencekit.errors import CatalogError

    row = conn.execute(
        "SELECT fencekit.session_is(c.relowner), pg_catalog.quote_ident(r.rolname), "
        "pg_catalog.quote_ident(session_user) "
        "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_roles r ON r.oid = c.relowner "
        "WHERE c.oid OPERATOR(pg_catalog.=) %s::pg_catalog.regclass",
        (pt.spec.table.sql,),
    ).fetchone()
    if row is None or row[0]:
        return
    owner, me = str(row[1]), str(row[2])
    raise CatalogError(
        f"refusing to read the row fences of {pt.spec.table} in a session of {me}: they are the "
        "table's rows, and reading them runs its owner's code (index and statistics expressions "
        "are evaluated while the read is planned), which fencekit runs only in a session logged "
        f"in as the owner {owner} (SET ROLE cannot contain it). Run: fencekit fences "
        f"{pt.spec.table.sql} ... --dsn <a DSN that logs in as {owner}> (a member of "
        "fencekit_admin)"
    )


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _primary_key(conn: psycopg.Connection[Any], table_sql: str) -> list[tuple[str, str]]:
    """The primary key's columns and the built-in types their values are read as, in index
    order (``fencekit.builtin_type``: a domain's base type; it refuses a type that is not built
    in, whose input, casts and checks would be the table owner's code run as the admin)."""
    rows = conn.execute(
        "SELECT a.attname, fencekit.builtin_type(i.indrelid::pg_catalog.regclass, "
        "a.attname::pg_catalog.text) "
        "FROM pg_catalog.pg_index i "
        "CROSS JOIN LATERAL pg_catalog.unnest(i.indkey) WITH ORDINALITY u(attnum, o) "
        "JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = u.attnum "
        "WHERE i.indrelid OPERATOR(pg_catalog.=) %s::pg_catalog.regclass AND i.indisprimary "
        "ORDER BY u.o",
        (table_sql,),
    ).fetchall()
    return [(str(r[0]), str(r[1])) for r in rows]


def _lateness(conn: psycopg.Connection[Any], pt: ProtectedTable) -> float | None:
    row = conn.execute(
        "SELECT max_lateness_seconds FROM fencekit.lateness "
        "WHERE schema_name = %s AND table_name = %s",
        (pt.spec.table.schema, pt.spec.table.name),
    ).fetchone()
    return float(row[0]) if row is not None and row[0] is not None else None


# ------------------------------------------------------------------------------- fences


def run_fences(args: argparse.Namespace) -> int:
    if args.top < 0:
        raise UsageError("--top must be 0 or more")
    with connect(dsn_from(args)) as conn, conn.transaction():
        pt = _protected(conn, args.table)
        if pt.spec.scope is Scope.ROW:
            doc = _row_fences(conn, pt, args.key, args.top)
        else:
            doc = _resource_fences(conn, pt, args.key, args.top)
    emit(args, doc, _fences_text(doc))
    return 0


def _row_fences(
    conn: psycopg.Connection[Any], pt: ProtectedTable, key: list[str], top: int
) -> dict[str, Any]:
    from psycopg import sql

    table = sql.SQL(pt.spec.table.sql)
    col = sql.Identifier(pt.spec.column)
    # Only in the owner's own session: its code that the reads below run, runs as the owner.
    _owner_session_only(conn, pt)
    # Every row, or an error: a policy forced on the owner would hide rows (and fences).
    conn.execute("SET row_security = off")
    conn.execute("SET search_path = pg_catalog, pg_temp")
    pk = _primary_key(conn, pt.spec.table.sql)
    doc: dict[str, Any] = {
        "table": pt.spec.table.dotted,
        "scope": "row",
        "column": pt.spec.column,
        "primary_key": [c for c, _ in pk],
        # Row fences keep no time per row: no lateness.
        "max_lateness_seconds": None,
    }
    rows, fenced, low, high = conn.execute(
        sql.SQL(
            "SELECT pg_catalog.count(*), pg_catalog.count({c}), pg_catalog.min({c}), "
            "pg_catalog.max({c}) FROM {t}"
        ).format(c=col, t=table)
    ).fetchone() or (0, 0, None, None)
    doc.update(rows=rows, fenced_rows=fenced, unfenced_rows=rows - fenced, min=low, max=high)
    ident = (
        sql.SQL("pg_catalog.jsonb_build_object({})").format(
            sql.SQL(", ").join(
                sql.SQL("{}, {}::pg_catalog.text").format(sql.Literal(c), sql.Identifier(c))
                for c, _ in pk
            )
        )
        if pk
        else sql.SQL("pg_catalog.jsonb_build_object('ctid', ctid::pg_catalog.text)")
    )
    doc["top"] = [
        {"key": k, "fence": f}
        for k, f in conn.execute(
            sql.SQL(
                "SELECT {i}, {c} FROM {t} WHERE {c} IS NOT NULL ORDER BY {c} DESC LIMIT {n}"
            ).format(i=ident, c=col, t=table, n=sql.Literal(top))
        ).fetchall()
    ]
    if key:
        if not pk:
            raise UsageError(f"{pt.spec.table} has no primary key: --key cannot find a row")
        if len(key) != len(pk):
            raise UsageError(
                f"the primary key of {pt.spec.table} is ({', '.join(c for c, _ in pk)}): give "
                f"{len(pk)} --key value(s), not {len(key)}"
            )
        where = sql.SQL(" AND ").join(
            sql.SQL("{} OPERATOR(pg_catalog.=) CAST({} AS {})").format(
                sql.Identifier(c), sql.Literal(v), sql.SQL(t)
            )
            for (c, t), v in zip(pk, key, strict=True)
        )
        found = conn.execute(
            sql.SQL("SELECT {i}, {c} FROM {t} WHERE {w}").format(i=ident, c=col, t=table, w=where)
        ).fetchone()
        if found is None:
            from fencekit.errors import CatalogError

            raise CatalogError(f"{pt.spec.table} has no row with primary key {key}")
        doc["row"] = {"key": found[0], "fence": found[1]}
    return doc


def _resource_fences(
    conn: psycopg.Connection[Any], pt: ProtectedTable, key: list[str], top: int
) -> dict[str, Any]:
    resource = pt.spec.resource or pt.spec.table.dotted
    row = conn.execute("SELECT resource FROM fencekit.protected WHERE tag = %s", (pt.tag,))
    found_res = row.fetchone()
    if found_res is not None and found_res[0]:
        resource = str(found_res[0])
    doc: dict[str, Any] = {
        "table": pt.spec.table.dotted,
        "scope": pt.spec.scope.value,
        "resource": resource,
        "key_columns": list(pt.spec.key),
        "max_lateness_seconds": _lateness(conn, pt),
    }
    count, low, high, last = conn.execute(
        "SELECT pg_catalog.count(*), pg_catalog.min(fence), pg_catalog.max(fence), "
        "pg_catalog.max(updated_at) FROM fencekit.fences WHERE resource = %s",
        (resource,),
    ).fetchone() or (0, None, None, None)
    doc.update(fences=count, min=low, max=high, last_advanced_at=_iso(last))
    select = (
        "SELECT key, fence, updated_at, "
        "pg_catalog.date_part('epoch', pg_catalog.clock_timestamp() - updated_at) "
        "FROM fencekit.fences WHERE resource = %s"
    )

    def entry(r: tuple[Any, ...]) -> dict[str, Any]:
        return {
            "key": r[0],
            "fence": r[1],
            "advanced_at": _iso(r[2]),
            "age_seconds": round(float(r[3]), 3),
        }

    doc["top"] = [
        entry(r)
        for r in conn.execute(
            select + " ORDER BY fence DESC, key LIMIT %s", (resource, top)
        ).fetchall()
    ]
    if pt.spec.scope is Scope.TABLE:
        if key:
            raise UsageError(f"{pt.spec.table} has a table fence: it takes no --key")
        text = ""
    elif key:
        text_row = conn.execute(
            "SELECT fencekit.key_text(%s::pg_catalog.regclass, %s::pg_catalog.text[])",
            (pt.spec.table.sql, key),
        ).fetchone()
        text = str(text_row[0]) if text_row else ""
    if pt.spec.scope is Scope.TABLE or key:
        one = conn.execute(select + " AND key = %s", (resource, text)).fetchone()
        # A key without a fence accepts every token.
        doc["key"] = entry(one) if one is not None else {"key": text, "fence": None}
    return doc


def _fences_text(doc: dict[str, Any]) -> list[str]:
    def late(v: float | None) -> str:
        return "none seen" if v is None else f"{v:.3f} s"

    def bounds() -> str:
        if doc["min"] is None:
            return "none yet"
        return f"lowest {doc['min']}, highest {doc['max']}"

    lines = [f"{doc['table']}: {doc['scope']} fence"]
    if doc["scope"] == "row":
        lines.append(
            f"  column {doc['column']}: {doc['rows']} row(s), {doc['fenced_rows']} with a fence, "
            f"{doc['unfenced_rows']} without; {bounds()}"
        )
        lines.append("  lateness: not kept for row fences (no time per row)")
        if doc["top"]:
            lines.append("  highest fences (primary key -> fence):")
            lines += [f"    {_key_text(t['key'])}  {t['fence']}" for t in doc["top"]]
        if "row" in doc:
            lines.append(f"  row {_key_text(doc['row']['key'])}: fence {doc['row']['fence']}")
        return lines
    lines.append(
        f"  resource {doc['resource']}: {doc['fences']} fence(s); {bounds()}; "
        f"last advanced {doc['last_advanced_at'] or 'never'}"
    )
    lines.append(f"  worst lateness of a rejected token: {late(doc['max_lateness_seconds'])}")
    if doc["top"] and doc["scope"] == "key":
        lines.append("  highest fences (key, fence, last advanced, ago):")
        lines += [
            f"    {t['key']}  {t['fence']}  {t['advanced_at']}  {t['age_seconds']:.0f} s"
            for t in doc["top"]
        ]
    if "key" in doc:
        k = doc["key"]
        name = "table" if doc["scope"] == "table" else f"key {k['key']}"
        if k["fence"] is None:
            lines.append(f"  {name}: no fence (accepts every token)")
        else:
            lines.append(
                f"  {name}: fence {k['fence']}, last advanced {k['advanced_at']} "
                f"({k['age_seconds']:.0f} s ago)"
            )
    return lines


def _key_text(key: dict[str, Any]) -> str:
    return ", ".join(f"{c}={v}" for c, v in key.items())


# ------------------------------------------------------------------------------- fence set


def _new_fence(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"--to {text!r} is not an integer") from None
    if not 1 <= value <= _BIGINT_MAX:
        raise UsageError(f"--to {text} is not a positive bigint (1 to {_BIGINT_MAX})")
    return value


def run_fence_set(args: argparse.Namespace) -> int:
    to = _new_fence(args.to)
    with connect(dsn_from(args)) as conn:
        pt = _protected(conn, args.table)
        row = conn.execute(
            "SELECT fencekit.set_fence(%s::pg_catalog.regclass, %s::pg_catalog.text[], %s, %s, %s)",
            (pt.spec.table.sql, list(args.key), to, bool(args.allow_lower), args.reason),
        ).fetchone()
    old = row[0] if row else None
    doc = {
        "action": "fence set",
        "table": pt.spec.table.dotted,
        "scope": pt.spec.scope.value,
        "key": list(args.key),
        "old_fence": old,
        "new_fence": to,
        "lowered": old is not None and to < old,
        "reason": args.reason,
    }
    where = f" key {', '.join(args.key)}" if args.key else ""
    text = [
        f"fence of {pt.spec.table}{where}: {old if old is not None else 'none'} -> {to}"
        + (" (lowered)" if doc["lowered"] else "")
        + "; recorded in fencekit.repairs"
    ]
    emit(args, doc, text)
    return 0
