"""Counts: rejections per table and reason, the worst lateness, fence repairs."""

from __future__ import annotations

from fencekit.catalog.model import Conn, ProtectedTable, Repairs, iso

__all__ = ["add_lateness", "add_rejections", "recent_repairs"]


def add_rejections(conn: Conn, tables: list[ProtectedTable]) -> None:
    by_name = {(pt.spec.table.schema, pt.spec.table.name): pt for pt in tables}
    rows = conn.execute(
        "SELECT schema_name, table_name, reason, count, last_rejected_at, max_token_gap "
        "FROM fencekit.rejections ORDER BY schema_name, table_name, reason"
    ).fetchall()
    for schema, name, reason, count, last_at, gap in rows:
        pt = by_name.get((schema, name))
        if pt is None:
            continue
        pt.rejections[reason] = int(count or 0)
        # Each row is about its reason: the table's last rejection is the latest of them, its
        # largest token gap is on the 'stale' row.
        if last_at is not None and (pt.last_rejected_at is None or last_at > pt.last_rejected_at):
            pt.last_rejected_at = last_at
        if gap is not None:
            pt.max_token_gap = int(gap)


def add_lateness(conn: Conn, tables: list[ProtectedTable]) -> None:
    if conn.execute("SELECT pg_catalog.to_regclass('fencekit.lateness')").fetchone() == (None,):
        return  # core older than the lateness gauge; status reports core_outdated
    by_name = {(pt.spec.table.schema, pt.spec.table.name): pt for pt in tables}
    for schema, name, late in conn.execute(
        "SELECT schema_name, table_name, max_lateness_seconds FROM fencekit.lateness"
    ).fetchall():
        pt = by_name.get((schema, name))
        if pt is not None and late is not None:
            pt.max_lateness_seconds = float(late)


def recent_repairs(conn: Conn) -> Repairs | None:
    """How many fence repairs fencekit.repairs holds, and the last one (its audit row is
    readable by fencekit_admin only: others get the counts)."""
    if conn.execute("SELECT pg_catalog.to_regclass('fencekit.repairs')").fetchone() == (None,):
        return None
    count, lowered, last_at = conn.execute(
        "SELECT COALESCE(pg_catalog.sum(repairs), 0), COALESCE(pg_catalog.sum(lowered), 0), "
        "pg_catalog.max(last_repaired_at) FROM fencekit.repair_counts"
    ).fetchone() or (0, 0, None)
    last = None
    readable = conn.execute(
        "SELECT pg_catalog.has_table_privilege('fencekit.repairs', 'SELECT')"
    ).fetchone()
    if count and readable and readable[0]:
        row = conn.execute(
            "SELECT repaired_at, repaired_by, schema_name, table_name, scope, resource, key, "
            "old_fence, new_fence, reason FROM fencekit.repairs ORDER BY id DESC LIMIT 1"
        ).fetchone()
        if row is not None:
            at, who, schema, name, scope, resource, key, old, new, reason = row
            where = f"{schema}.{name}" if name is not None else f"resource {resource}"
            what = "" if scope == "table" else f" key {key}"
            last = (
                f"{iso(at)} by {who}: {where}{what} fence {old if old is not None else 'none'}"
                f" -> {new}" + (f" ({reason})" if reason else "")
            )
    return Repairs(int(count), int(lowered), last_at, last)
