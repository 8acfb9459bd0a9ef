"""Who owns fencekit's objects: a restore by an application role leaves it owning the
fences, the registry and the checks. Drift names each owner that is not the installing role
(or is neither a superuser nor a member of fencekit_admin), with the SQL that gives the
objects back."""

from __future__ import annotations

from collections.abc import Collection

from fencekit.catalog.model import Conn, Drift, DriftKind
from fencekit.ident import quote_ident, quote_literal

__all__ = ["ownership_drift"]

# Every object in schema fencekit with its owner and the ALTER that changes it (without OWNER
# TO). Indexes and a table's own sequences follow their table; array types follow their element.
_OWNED_SQL = """
SELECT 'schema' AS kind, 'fencekit' AS name, n.nspowner AS owner,
       'ALTER SCHEMA fencekit' AS alter_sql, n.nspname AS ident, n.oid
  FROM pg_catalog.pg_namespace n WHERE n.nspname = 'fencekit'
UNION ALL
SELECT CASE c.relkind WHEN 'S' THEN 'sequence' WHEN 'v' THEN 'view'
                      WHEN 'm' THEN 'materialized view' WHEN 'f' THEN 'foreign table'
                      WHEN 'c' THEN 'type' ELSE 'table' END,
       'fencekit.' || pg_catalog.quote_ident(c.relname), c.relowner,
       'ALTER ' || CASE c.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW'
                                  WHEN 'm' THEN 'MATERIALIZED VIEW' WHEN 'f' THEN 'FOREIGN TABLE'
                                  WHEN 'c' THEN 'TYPE' ELSE 'TABLE' END
         || ' fencekit.' || pg_catalog.quote_ident(c.relname), c.relname, c.oid
  FROM pg_catalog.pg_class c
 WHERE c.relnamespace OPERATOR(pg_catalog.=) 'fencekit'::pg_catalog.regnamespace
   AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f', 'c')
   AND NOT EXISTS (SELECT FROM pg_catalog.pg_depend d
                    WHERE c.relkind = 'S'
                      AND d.classid OPERATOR(pg_catalog.=)
                          'pg_catalog.pg_class'::pg_catalog.regclass
                      AND d.objid = c.oid AND d.deptype IN ('a', 'i')
                      AND d.refclassid OPERATOR(pg_catalog.=)
                          'pg_catalog.pg_class'::pg_catalog.regclass)
UNION ALL
SELECT CASE p.prokind WHEN 'p' THEN 'procedure' WHEN 'a' THEN 'aggregate' ELSE 'function' END,
       'fencekit.' || pg_catalog.quote_ident(p.proname) || s.args, p.proowner,
       'ALTER ' || CASE p.prokind WHEN 'p' THEN 'PROCEDURE' WHEN 'a' THEN 'AGGREGATE'
                                  ELSE 'FUNCTION' END
         || ' fencekit.' || pg_catalog.quote_ident(p.proname) || s.args, p.proname, p.oid
  FROM pg_catalog.pg_proc p,
       LATERAL (SELECT CASE p.prokind
                  WHEN 'a' THEN '(' || pg_catalog.pg_get_function_identity_arguments(p.oid) || ')'
                  ELSE '(' || COALESCE((SELECT pg_catalog.string_agg(
                                               pg_catalog.format_type(a.t, NULL), ', '
                                               ORDER BY a.n)
                                          FROM pg_catalog.unnest(p.proargtypes::pg_catalog.oid[])
                                               WITH ORDINALITY AS a(t, n)), '') || ')'
                  END) AS s(args)
 WHERE p.pronamespace OPERATOR(pg_catalog.=) 'fencekit'::pg_catalog.regnamespace
UNION ALL
SELECT 'type', 'fencekit.' || pg_catalog.quote_ident(t.typname), t.typowner,
       'ALTER TYPE fencekit.' || pg_catalog.quote_ident(t.typname), t.typname, t.oid
  FROM pg_catalog.pg_type t
 WHERE t.typnamespace OPERATOR(pg_catalog.=) 'fencekit'::pg_catalog.regnamespace
   AND t.typtype IN ('e', 'd', 'r')
"""

#: For a function ``o`` of _OWNED_SQL: it is a row fence's TRUNCATE check owned by its
#: table's owner, by design. Found through the trigger that calls it (its table may have been
#: renamed: then status says to run fencekit rename, never to give the check to the installer,
#: which would refuse every TRUNCATE), or through the registered name.
_TABLE_OWNED_TRUNC = """
SELECT FROM fencekit.protected t
 WHERE t.scope = 'row' AND o.ident = t.tag || '_trunc'
   AND (EXISTS (SELECT FROM pg_catalog.pg_trigger g
                  JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) g.tgrelid
                 WHERE g.tgfoid OPERATOR(pg_catalog.=) o.oid
                   AND g.tgname = 'fencekit_' || t.tag || '_trunc'
                   AND c.relowner OPERATOR(pg_catalog.=) o.owner)
        OR EXISTS (SELECT FROM pg_catalog.pg_class c
                    WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(
                          pg_catalog.format('%I.%I', t.schema_name, t.table_name))
                      AND c.relowner OPERATOR(pg_catalog.=) o.owner))
"""

_SHOWN = 3  # object names a grouped ownership line shows before "and N more"
_LISTED = 5  # up to this many objects the fix lists ALTER statements; beyond, a DO block


def ownership_drift(conn: Conn, skip: Collection[str] = ()) -> list[Drift]:
    """fencekit's objects owned by another role than the one that installed it, or by a role
    that is neither a superuser nor a member of fencekit_admin. A protected table's generated
    functions and counters may also belong to any superuser or member of fencekit_admin (the
    role that ran protect), and a row fence's TRUNCATE check (``<tag>_trunc``) to the table's
    owner, since it reads the table.

    Whoever owns fencekit's tables and functions can lower fences, edit the registry and
    replace the checks; a ``pg_restore`` run by an application role leaves them all owned by
    it. The installing role is ``fencekit.meta``'s ``owner`` row; cores installed before it
    existed fall back to the owner of schema fencekit. Functions in ``skip`` (as regprocedure
    text: functions fencekit did not create, to be dropped) are left out.
    """
    skipped = {s.replace(" ", "") for s in skip}
    schema = conn.execute(
        "SELECT n.nspowner::pg_catalog.regrole::pg_catalog.text FROM pg_catalog.pg_namespace n "
        "WHERE n.nspname = 'fencekit'"
    ).fetchone()
    if schema is None:
        return []
    out: list[Drift] = []
    recorded = conn.execute("SELECT value FROM fencekit.meta WHERE key = 'owner'").fetchone()
    expected, source = str(schema[0]), "the owner of schema fencekit"
    if recorded is not None:
        exists = conn.execute(
            "SELECT pg_catalog.quote_ident(rolname) FROM pg_catalog.pg_roles WHERE rolname = %s",
            (recorded[0],),
        ).fetchone()
        if exists is not None:
            expected, source = str(exists[0]), "the role that installed fencekit"
        else:
            out.append(
                Drift(
                    DriftKind.OWNER_ROLE_MISSING,
                    "fencekit",
                    f"role {recorded[0]!r}, recorded in fencekit.meta as the role that "
                    f"installed fencekit, does not exist (renamed or dropped?); comparing "
                    f"owners with {expected}, the owner of schema fencekit",
                    "record the role that administers fencekit (as a member of fencekit_admin): "
                    "UPDATE fencekit.meta SET value = '<admin_role>' WHERE key = 'owner'",
                )
            )
    # A protected table's own functions and counters belong to whoever ran protect: the
    # installing role, or a member of fencekit_admin such as the migration role.
    rows = conn.execute(
        "SELECT o.kind, o.name, o.alter_sql, r.rolname, r.rolsuper, "
        "       pg_catalog.pg_has_role(r.oid, a.oid, 'MEMBER'), "
        "       o.kind IN ('function', 'sequence') AND EXISTS ("
        "         SELECT FROM fencekit.protected t WHERE pg_catalog.left(o.ident, "
        "           pg_catalog.length(t.tag) + 1) IN (t.tag || '_', t.tag || ':')), "
        # A row fence's TRUNCATE check reads the table: it belongs to the table's owner. The
        # table is the one its trigger is on (renamed or not), or the one of the registered name.
        f"       o.kind = 'function' AND EXISTS ({_TABLE_OWNED_TRUNC}) "
        f"FROM ({_OWNED_SQL}) o "
        "JOIN pg_catalog.pg_roles r ON r.oid = o.owner "
        "LEFT JOIN pg_catalog.pg_roles a ON a.rolname = 'fencekit_admin' "
        "ORDER BY r.rolname, o.kind <> 'schema', o.kind, o.name"
    ).fetchall()
    by_owner: dict[str, list[tuple[str, str, str]]] = {}
    privileged: dict[str, bool] = {}
    for kind, name, alter_sql, owner, is_super, is_admin, per_table, table_owned in rows:
        role = quote_ident(owner)
        if table_owned or (kind == "function" and name.replace(" ", "") in skipped):
            continue
        privileged[role] = bool(is_super) or bool(is_admin)
        if per_table and privileged[role] and role != expected:
            continue
        by_owner.setdefault(role, []).append((kind, name, alter_sql))
    record = (
        "UPDATE fencekit.meta SET value = {new} WHERE key = 'owner'" if recorded is not None else ""
    )
    for role, objects in by_owner.items():
        names = tuple(f"{kind} {name}" for kind, name, _ in objects)
        shown = ", ".join(names[:_SHOWN]) + (
            f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
        )
        unprivileged = (
            f"{role} is neither a superuser nor a member of fencekit_admin"
            if not privileged[role]
            else ""
        )
        if role != expected:
            # One line per owner: an unprivileged owner is said here, not on a line of its own.
            out.append(
                Drift(
                    DriftKind.OWNER_CHANGED,
                    f"owner {role}",
                    f"{len(objects)} object(s) in schema fencekit are owned by {role}, not "
                    f"{expected} ({source}): {shown}. Their owner can lower fences, edit the "
                    "registry and replace the checks (a pg_restore run by an application role "
                    "leaves them so). Handing them back is not enough on its own: a function "
                    "keeps its body and a table its triggers; run fencekit install again after "
                    "the fix, which rewrites every core function and refuses while a trigger, "
                    "rule or policy fencekit did not make is on its tables"
                    + (f"; {unprivileged}" if unprivileged else ""),
                    _owner_fix(role, expected, objects),
                    names,
                )
            )
        elif unprivileged:
            admin = "<admin_role>"
            give = _owner_fix(role, admin, objects)
            if record:
                give += "; " + record.format(new=quote_literal(admin))
            out.append(
                Drift(
                    DriftKind.OWNER_UNPRIVILEGED,
                    f"owner {role}",
                    f"{role} owns {len(objects)} object(s) in schema fencekit ({shown}) but "
                    "is neither a superuser nor a member of fencekit_admin: if applications "
                    "log in as it (or as a member of it), they can lower fences, edit the "
                    "registry and replace the checks",
                    f"if {role} is an application role, give fencekit's objects to a role "
                    "that administers fencekit (a superuser or a member of fencekit_admin that "
                    f"applications never log in as): {give}\n"
                    f"if {role} is that role already: GRANT fencekit_admin TO {role}",
                    names,
                )
            )
    # A TRUNCATE check not owned by its table's owner, unless a line above names it already.
    named = {o for d in out for o in d.objects}
    out += [d for d in _truncate_check_drift(conn) if not named.intersection(d.objects)]
    return out


def _truncate_check_drift(conn: Conn) -> list[Drift]:
    """Row fences whose TRUNCATE check (``fencekit.<tag>_trunc``, which reads the table) does
    not belong to the table's owner: protected before the table changed owner (or by an older
    release). The check refuses every TRUNCATE under a token until it belongs to the owner."""
    rows = conn.execute(
        "SELECT pg_catalog.format('fencekit.%I()', p.proname), "
        "       pg_catalog.quote_ident(fo.rolname), pg_catalog.quote_ident(t_o.rolname), "
        "       c.oid::pg_catalog.regclass::pg_catalog.text "
        "FROM fencekit.protected t "
        "JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass("
        "     pg_catalog.format('%I.%I', t.schema_name, t.table_name)) "
        "JOIN pg_catalog.pg_proc p ON p.pronamespace OPERATOR(pg_catalog.=) "
        "     'fencekit'::pg_catalog.regnamespace AND p.proname = t.tag || '_trunc' "
        "     AND p.pronargs = 0 "
        "JOIN pg_catalog.pg_roles fo ON fo.oid = p.proowner "
        "JOIN pg_catalog.pg_roles t_o ON t_o.oid = c.relowner "
        "WHERE t.scope = 'row' AND p.proowner <> c.relowner "
        # The registered name is the protected table, not one that took its name after a
        # rename (status reports the rename; fencekit rename fixes it, owner included).
        "  AND EXISTS (SELECT FROM pg_catalog.pg_trigger g WHERE g.tgrelid = c.oid "
        "              AND g.tgname = 'fencekit_' || t.tag || '_trunc') "
        "ORDER BY 4"
    ).fetchall()
    return [
        Drift(
            DriftKind.OWNER_CHANGED,
            str(table),
            f"{fn}, the TRUNCATE check that reads {table}'s fences, belongs to {fn_owner}, not "
            f"to the table's owner {owner}: reading the table would run {owner}'s code with "
            f"{fn_owner}'s rights, so every TRUNCATE under a token is refused until it belongs "
            "to the owner (the table changed owner after protect)",
            f"ALTER FUNCTION {fn} OWNER TO {owner} (as a superuser), or re-run fencekit "
            "protect on the table",
            (f"function {fn}",),
        )
        for fn, fn_owner, owner, table in rows
    ]


def _owner_fix(old: str, new: str, objects: list[tuple[str, str, str]]) -> str:
    """SQL a DBA runs (superuser, or member of both roles) to give ``old``'s objects to ``new``.

    A few objects: their ALTER statements. More: a DO block over the catalog (REASSIGN OWNED
    would also take the application's own tables, and its database, from ``old``).
    """
    if len(objects) <= _LISTED:
        return "; ".join(f"{alter_sql} OWNER TO {new}" for _, _, alter_sql in objects)
    by = f"{quote_literal(old)}::pg_catalog.regrole"
    # oid = regrole/regnamespace has no exact match in pg_catalog: qualified, or an operator
    # planted in public would run as the DBA who pastes this.
    eq = "OPERATOR(pg_catalog.=)"
    ns = "'fencekit'::pg_catalog.regnamespace"
    return "\n".join(
        [
            "DO $fix$",
            "DECLARE o text;",
            "BEGIN",
            "  IF (SELECT nspowner FROM pg_catalog.pg_namespace WHERE nspname = 'fencekit')",
            f"     {eq} {by} THEN ALTER SCHEMA fencekit OWNER TO {new}; END IF;",
            "  FOR o IN SELECT c.oid::pg_catalog.regclass FROM pg_catalog.pg_class c",
            f"    WHERE c.relnamespace {eq} {ns} AND c.relowner {eq} {by}",
            "      AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S') AND NOT EXISTS (SELECT FROM",
            "      pg_catalog.pg_depend d WHERE c.relkind = 'S' AND d.objid = c.oid",
            "      AND d.deptype IN ('a', 'i')",
            "      AND d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass",
            "      AND d.refclassid OPERATOR(pg_catalog.=)",
            "          'pg_catalog.pg_class'::pg_catalog.regclass)",
            f"  LOOP EXECUTE 'ALTER TABLE ' || o || ' OWNER TO {new}'; END LOOP;",
            "  FOR o IN SELECT p.oid::pg_catalog.regprocedure FROM pg_catalog.pg_proc p",
            f"    WHERE p.pronamespace {eq} {ns} AND p.proowner {eq} {by}",
            f"  LOOP EXECUTE 'ALTER ROUTINE ' || o || ' OWNER TO {new}'; END LOOP;",
            "  FOR o IN SELECT t.oid::pg_catalog.regtype FROM pg_catalog.pg_type t",
            f"    WHERE t.typnamespace {eq} {ns} AND t.typowner {eq} {by}",
            "      AND t.typtype IN ('e', 'd', 'r')",
            f"  LOOP EXECUTE 'ALTER TYPE ' || o || ' OWNER TO {new}'; END LOOP;",
            "END",
            "$fix$;",
        ]
    )
