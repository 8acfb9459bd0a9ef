"""The columns fencekit's objects read by name (a row fence's fence column, a key fence's key
columns) against the columns protect bound them to.

A table's owner can rename such a column away, and add another under its name. The row
triggers and the key fence's triggers read columns by name, so they then judge writes by the
new column (or, none added, fail); what PostgreSQL binds by attnum stays on the old one: the
row fence's INSERT trigger's WHEN clause (a dependency in pg_depend) and the fence column's
DEFAULT. Protect records the attnums it bound on the protected table
(``fencekit.protected.attnums``) and a row fence's on each partition and child
(``child_attnums``), compared by the table's ``table_oid`` whatever it is named now, while the
recorded oids are this database's (not after a restore: ``fencekit.recorded_oids_hold``); on
the table and on a row fence's partitions and inheritance children the INSERT trigger's WHEN
clause or the fence DEFAULT left on another column also tells which column fencekit protected
there, after a restore too (``fencekit.swapped_descendant_columns``, which protect, cover and
rename refuse by). Reads
only the catalogs and fencekit.protected: nothing of the table's is evaluated, and default
expressions are compared as node-tree text, never deparsed.
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
    """Drift of the columns ``spec``'s objects read by name on the protected table ``oid``
    (whatever it is named now: a renamed table is compared too) and (a row fence) on its
    ``descendants`` (oid, regclass text, label): a column swapped under its name or renamed away
    (``fence_column_swapped``, ``key_column_swapped``), a fence column without its DEFAULT
    (``fence_default_missing``)."""
    cols = [spec.column] if spec.scope is Scope.ROW else list(spec.key)
    if not cols:
        return []  # a table fence's triggers read no column
    here = _regclass(conn, oid)
    out: list[Drift] = []
    for col, old, added in _swapped_at_root(conn, oid, spec, cols):
        out.append(_swapped(spec, here, here, col, old, added=added))
    if not out and spec.scope is Scope.KEY:
        # After a restore the recorded attnums are not compared: the _keys trigger's UPDATE OF
        # list, which binds the key columns by attnum, still tells (47_protect.sql).
        for col, old, added in conn.execute(
            "SELECT s.col, s.was::pg_catalog.text, s.added FROM fencekit.protected p, "
            "fencekit.swapped_key_columns(%s::pg_catalog.oid::pg_catalog.regclass, p.spec, "
            "p.tag) s WHERE p.schema_name = %s AND p.table_name = %s "
            "AND NOT fencekit.recorded_oids_hold(p.tag)",
            (oid, spec.table.schema, spec.table.name),
        ).fetchall():
            out.append(_swapped(spec, here, here, str(col), old, added=bool(added)))
    if spec.scope is not Scope.ROW or out:
        # A swap on the protected table reaches its descendants (RENAME COLUMN and ADD COLUMN
        # recurse), and so does the fix: one drift, on the table.
        return out
    ins = _insert_trigger(spec)
    relations = [(oid, here, here), *list(descendants)]
    labels = {o: (sql, label) for o, sql, label in relations}
    # Witnesses by attnum on the table (after a restore its recorded attnum is not compared),
    # its partitions and children: the INSERT trigger's WHEN clause, fencekit's fence DEFAULT
    # left on the column renamed away, a child's recorded attnum
    # (fencekit.swapped_descendant_columns, 47_protect.sql).
    swapped = {
        int(rel): str(was)
        for rel, was in conn.execute(
            "SELECT s.child::pg_catalog.oid, s.was::pg_catalog.text "
            "FROM fencekit.swapped_descendant_columns(%s::pg_catalog.oid::pg_catalog.regclass, "
            "%s, %s) s",
            (oid, spec.column, ins),
        ).fetchall()
    }
    for rel, now, has_default in conn.execute(
        "SELECT r.oid, b.attnum, "
        "EXISTS (SELECT FROM pg_catalog.pg_attrdef f WHERE f.adrelid = r.oid "
        "AND f.adnum = b.attnum) "
        "FROM pg_catalog.unnest(%s::pg_catalog.oid[]) WITH ORDINALITY AS r(oid, o) "
        "LEFT JOIN pg_catalog.pg_attribute b ON b.attrelid = r.oid AND b.attname = %s "
        "AND b.attnum > 0 AND NOT b.attisdropped ORDER BY r.o",
        ([o for o, _, _ in relations], spec.column),
    ).fetchall():
        sql, label = labels[int(rel)]
        if int(rel) in swapped:
            old = swapped[int(rel)]
            out.append(
                _swapped(
                    spec,
                    sql,
                    label,
                    spec.column,
                    old,
                    _parents(conn, int(rel)) if int(rel) != oid else [],
                    now is not None,
                )
            )
        elif now is not None and not has_default:
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


def _regclass(conn: Conn, oid: int) -> str:
    """The relation ``oid`` as SQL names it now (its registry name may be an old one)."""
    row = conn.execute("SELECT %s::pg_catalog.oid::pg_catalog.regclass::pg_catalog.text", (oid,))
    return str(row.fetchone()[0])  # type: ignore[index]


def fence_column_renamed(conn: Conn, oid: int, spec: FenceSpec) -> bool:
    """Whether a row fence's column was renamed away on ``oid`` with none added under its name:
    the column protect recorded is live under another name (``bound_column_drift`` reports it;
    it is not "dropped")."""
    return any(not added for _, _, added in _swapped_at_root(conn, oid, spec, [spec.column]))


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
) -> list[tuple[str, str | None, bool]]:
    """(column, name of the column protect bound or None when dropped, whether another column
    has the name now) for each column that is not the one protect recorded: renamed away (with
    or without another added under its name), or dropped and added again. The registry row is
    ``spec``'s, found with the table's oid (``oid`` may be the table renamed). Not compared
    after a restore (the table has another oid, and its columns may be renumbered:
    ``fencekit.recorded_oids_hold``); the witnesses by attnum that a restore keeps are."""
    rows = conn.execute(
        "SELECT u.col, a.attname::pg_catalog.text, b.attnum IS NOT NULL "
        "FROM fencekit.protected p, "
        "ROWS FROM (pg_catalog.unnest(p.attnums), pg_catalog.unnest(%s::pg_catalog.text[])) "
        "WITH ORDINALITY AS u(was, col, o) "
        "LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = %s AND a.attnum = u.was "
        "AND NOT a.attisdropped "
        "LEFT JOIN pg_catalog.pg_attribute b ON b.attrelid = %s AND b.attname = u.col "
        "AND b.attnum > 0 AND NOT b.attisdropped "
        "WHERE p.schema_name = %s AND p.table_name = %s AND p.table_oid = %s "
        "AND fencekit.recorded_oids_hold(p.tag) "
        "AND p.attnums IS NOT NULL AND b.attnum IS DISTINCT FROM u.was "
        "AND (b.attnum IS NOT NULL OR a.attname IS NOT NULL) ORDER BY u.o",
        (cols, oid, oid, spec.table.schema, spec.table.name, oid),
    ).fetchall()
    return [(str(col), None if old is None else str(old), bool(added)) for col, old, added in rows]


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
    added: bool = True,
) -> Drift:
    """The drift of ``col`` on the relation ``sql``: another column than the one protected,
    which is now named ``old`` (None: dropped); or (not ``added``) no column of that name, the
    protected one renamed to ``old``. An inheritance child's inherited column is renamed only
    out of the tree: ``parents``, to leave and join again."""
    if not added and old is not None:
        return _renamed_away(spec, sql, label, col, old, parents)
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


def _renamed_away(
    spec: FenceSpec, sql: str, label: str, col: str, old: str, parents: Sequence[str]
) -> Drift:
    """``col`` renamed to ``old`` with none added under its name: the triggers that read it by
    name fail (writes are refused), the fences are intact in ``old``; re-protect refuses (it
    would add a new, empty column and bind to it)."""
    row = spec.scope is Scope.ROW
    what = "fence" if row else "key"
    kept = "the rows' fences are intact there" if row else "its keys name the fences"
    leave = "".join(f"ALTER TABLE {sql} NO INHERIT {p}; " for p in parents)
    join = "".join(f"; ALTER TABLE {sql} INHERIT {p}" for p in parents)
    return Drift(
        DriftKind.FENCE_COLUMN_SWAPPED if row else DriftKind.KEY_COLUMN_SWAPPED,
        f"{sql}.{col}",
        f"{what} column {col} of {label} was renamed to {old}, the column fencekit protected "
        f"(not dropped: {kept}); fencekit's triggers read {col} by name and fail, so writes "
        "are refused; re-protect refuses, since it would add a new, empty column under the "
        "name and bind to it",
        f"as the table's owner, rename it back: {leave}ALTER TABLE {sql} RENAME COLUMN "
        f"{quote_ident(old)} TO {quote_ident(col)}{join}; or {COMMAND}, then protect again "
        "(the fences restart)",
        command=Command(Action.UNPROTECT, spec),
    )
