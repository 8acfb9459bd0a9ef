"""The columns fencekit's objects read by name (a row fence's fence column, a key fence's key
columns) against the columns protect bound them to.

A table's owner can rename such a column away and add another under its name. The row
triggers and the key fence's triggers read columns by name, so they then judge writes by the
new column; what PostgreSQL binds by attnum stays on the old one: the row fence's INSERT
trigger's WHEN clause (a dependency in pg_depend) and the fence column's DEFAULT. Protect
records the attnums it bound on the protected table (``fencekit.protected.attnums``, by its
``table_oid``); on a row fence's partitions and inheritance children the INSERT trigger's WHEN
clause tells which column fencekit protected there. Reads only the catalogs and
fencekit.protected: nothing of the table's is evaluated.
"""

from __future__ import annotations

from collections.abc import Sequence

from fencekit import sqlgen
from fencekit.catalog.model import COMMAND, Action, Command, Conn, Drift, DriftKind
from fencekit.ident import quote_ident
from fencekit.spec import FenceSpec, Scope

__all__ = ["bound_column_drift"]


def bound_column_drift(
    conn: Conn, oid: int, spec: FenceSpec, descendants: Sequence[tuple[int, str, str]]
) -> list[Drift]:
    """Drift of the columns ``spec``'s objects read by name on the protected table ``oid`` and
    (a row fence) on its ``descendants`` (oid, regclass text, label): a column swapped under
    its name (``fence_column_swapped``, ``key_column_swapped``), a fence column without its
    DEFAULT (``fence_default_missing``)."""
    cols = [spec.column] if spec.scope is Scope.ROW else list(spec.key)
    if not cols:
        return []  # a table fence's triggers read no column
    out: list[Drift] = []
    for col, old in _swapped_at_root(conn, oid, spec, cols):
        out.append(_swapped(spec, spec.table.sql, spec.table.sql, col, old))
    if spec.scope is not Scope.ROW or out:
        # A swap on the protected table reaches its descendants (RENAME COLUMN and ADD COLUMN
        # recurse), and so does the fix: one drift, on the table.
        return out
    ins = _insert_trigger(spec)
    relations = [(oid, spec.table.sql, spec.table.sql), *list(descendants)]
    labels = {o: (sql, label) for o, sql, label in relations}
    for rel, now, bound, has_default in conn.execute(
        "SELECT r.oid, b.attnum, "
        "ARRAY(SELECT d.refobjsubid FROM pg_catalog.pg_trigger g "
        "JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_trigger'::pg_catalog.regclass"
        " AND d.objid = g.oid AND d.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass"
        " AND d.refobjid = r.oid AND d.refobjsubid > 0 "
        "WHERE g.tgrelid = r.oid AND g.tgname = %s ORDER BY 1), "
        "EXISTS (SELECT FROM pg_catalog.pg_attrdef f WHERE f.adrelid = r.oid "
        "AND f.adnum = b.attnum) "
        "FROM pg_catalog.unnest(%s::pg_catalog.oid[]) WITH ORDINALITY AS r(oid, o) "
        "LEFT JOIN pg_catalog.pg_attribute b ON b.attrelid = r.oid AND b.attname = %s "
        "AND b.attnum > 0 AND NOT b.attisdropped ORDER BY r.o",
        (ins, [o for o, _, _ in relations], spec.column),
    ).fetchall():
        if now is None:
            continue  # no fence column: fence_column_missing
        sql, label = labels[int(rel)]
        if bound and now not in bound:
            # The INSERT trigger's WHEN clause reads the fence column only: one attnum.
            old = _name_at(conn, int(rel), bound[0])
            out.append(_swapped(spec, sql, label, spec.column, old, _parents(conn, int(rel))))
        elif not has_default:
            out.append(
                Drift(
                    DriftKind.FENCE_DEFAULT_MISSING,
                    f"{sql}.{spec.column}",
                    f"fence column {spec.column} of {label} has no DEFAULT: each row an INSERT "
                    "writes there runs fencekit's INSERT trigger (still checked, slower)",
                    f"{COMMAND} (sets it again)",
                    command=Command(Action.PROTECT, spec),
                )
            )
    return out


def _insert_trigger(spec: FenceSpec) -> str:
    """The name of the row fence's INSERT trigger, whose WHEN clause reads the fence column."""
    (name,) = [
        t.name
        for t in sqlgen.table_objects(spec).triggers
        if t.level == "ROW" and "INSERT" in t.timing and t.when is not None
    ]
    return name


def _swapped_at_root(
    conn: Conn, oid: int, spec: FenceSpec, cols: list[str]
) -> list[tuple[str, str | None]]:
    """(column, name of the column protect bound, None when dropped) for each column whose
    name is now another column's than the one protect recorded. Not compared after a restore
    (the table has another oid, and its columns may be renumbered)."""
    rows = conn.execute(
        "SELECT u.col, a.attname::pg_catalog.text FROM fencekit.protected p, "
        "ROWS FROM (pg_catalog.unnest(p.attnums), pg_catalog.unnest(%s::pg_catalog.text[])) "
        "WITH ORDINALITY AS u(was, col, o) "
        "LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = %s AND a.attnum = u.was "
        "AND NOT a.attisdropped "
        "JOIN pg_catalog.pg_attribute b ON b.attrelid = %s AND b.attname = u.col "
        "AND b.attnum > 0 AND NOT b.attisdropped "
        "WHERE p.schema_name = %s AND p.table_name = %s AND p.table_oid = %s "
        "AND p.attnums IS NOT NULL "
        "AND b.attnum IS DISTINCT FROM u.was ORDER BY u.o",
        (cols, oid, oid, spec.table.schema, spec.table.name, oid),
    ).fetchall()
    return [(str(col), None if old is None else str(old)) for col, old in rows]


def _name_at(conn: Conn, oid: int, attnum: int) -> str | None:
    row = conn.execute(
        "SELECT attname::pg_catalog.text FROM pg_catalog.pg_attribute "
        "WHERE attrelid = %s AND attnum = %s AND NOT attisdropped",
        (oid, attnum),
    ).fetchone()
    return None if row is None else str(row[0])


def _parents(conn: Conn, oid: int) -> list[str]:
    """The tables an inheritance child inherits from ([] for a partition: its column is its
    parent's, renamed with it)."""
    return [
        str(r[0])
        for r in conn.execute(
            "SELECT i.inhparent::pg_catalog.regclass::pg_catalog.text "
            "FROM pg_catalog.pg_inherits i JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhrelid = %s AND NOT c.relispartition ORDER BY i.inhseqno",
            (oid,),
        ).fetchall()
    ]


def _swapped(
    spec: FenceSpec,
    sql: str,
    label: str,
    col: str,
    old: str | None,
    parents: Sequence[str] = (),
) -> Drift:
    """The drift of ``col`` on the relation ``sql``: another column than the one protected,
    which is now named ``old`` (None: dropped). An inheritance child's inherited column is
    renamed only out of the tree: ``parents``, to leave and join again."""
    row = spec.scope is Scope.ROW
    where = "was dropped" if old is None else f"is now named {old}"
    if row:
        what = (
            f"fence column {col} of {label} is not the column fencekit protected: that one "
            f"{where}. fencekit's row triggers read and write the new column by name, while "
            "its INSERT trigger's WHEN clause and the fence DEFAULT stay on the old one: "
            + (
                "the rows' fences were dropped with it"
                if old is None
                else f"the rows' fences stay in {old}"
            )
            + ", the new column holds none of them, and stale writes pass"
        )
        kind = DriftKind.FENCE_COLUMN_SWAPPED
        holds = "the fences from before the swap"
    else:
        what = (
            f"key column {col} of {label} is not the column fencekit protected: that one "
            f"{where}. fencekit's key triggers read the new column by name, so each write is "
            "judged by the fence of the key the new column holds: the fences of the rows' "
            "protected keys no longer guard them, and stale writes pass"
        )
        kind = DriftKind.KEY_COLUMN_SWAPPED
        holds = "the keys the fences name"
    restart = f"{COMMAND}, then protect again (the fences restart); re-protect alone refuses"
    if old is None:
        fix = restart
    else:
        leave = "".join(f"ALTER TABLE {sql} NO INHERIT {p}; " for p in parents)
        join = "".join(f"; ALTER TABLE {sql} INHERIT {p}" for p in parents)
        fix = (
            f"as the table's owner, put the protected column back under its name: {leave}"
            f"ALTER TABLE {sql} RENAME COLUMN {quote_ident(col)} TO <spare name>; ALTER TABLE "
            f"{sql} RENAME COLUMN {quote_ident(old)} TO {quote_ident(col)}{join} (it holds "
            f"{holds}; what was written since is in the spare column); or {restart}"
        )
    return Drift(kind, f"{sql}.{col}", what, fix, command=Command(Action.UNPROTECT, spec))
