"""Code fencekit did not generate that runs on a protected table, triggers apart: defaults
and generated columns, column types, constraints, indexes, row-level security policies, rules,
what foreign keys cascade into, and views written through. Each is drift unless its code hash
is allowed (``fencekit.allowed_code``)."""

from __future__ import annotations

from fencekit.catalog.codeinfo import FIRST_NORMAL_OID, Code, Inspector, code_hash
from fencekit.catalog.model import Action, Command, Conn, Drift, DriftKind
from fencekit.catalog.triggers import allow_fix, other_triggers
from fencekit.ident import quote_ident
from fencekit.spec import FenceSpec, Scope

__all__ = ["foreign_code_drift"]

#: One object that may run code: (kind, object, what, code, definition, effect).
_Found = tuple[DriftKind, str, str, Code, str, str]

_SWAPS = "it can set fencekit.token, and the check reads the swapped token"
_RULE = Code(("rewrites the statements that name the relation",))
_RULE_EFFECT = (
    "its statements run with the writer's, can set fencekit.token or redirect the write past "
    "fencekit's checks"
)


def foreign_code_drift(
    conn: Conn,
    insp: Inspector,
    oid: int,
    rel_sql: str,
    spec: FenceSpec,
    allowed: frozenset[str],
) -> list[Drift]:
    """Everything but the relation's own triggers that runs code fencekit did not generate:
    column defaults and generated columns (the fence column's included), the types of its
    columns, CHECK and exclusion constraints, index expressions, predicates and operator
    classes, row-level security policies (when enabled), rules; the triggers, rules and
    expressions of tables a foreign key cascades into; views over the table that run code
    when written through."""
    fence_col = spec.column if spec.scope is Scope.ROW else None
    found = _expression_code(conn, insp, oid, rel_sql, fence_col) + _rules(conn, oid, rel_sql)
    out = [d for f in found for d in _code_drift(*f, allowed)]
    out += _cascade_drift(conn, insp, oid, rel_sql, allowed, {oid})
    out += _view_drift(conn, insp, oid, rel_sql, allowed, {oid})
    return out


def _code_drift(
    kind: DriftKind,
    obj: str,
    what: str,
    code: Code,
    definition: str,
    effect: str,
    allowed: frozenset[str],
) -> list[Drift]:
    """One object that runs code fencekit did not generate, unless its hash is allowed."""
    if not code:
        return []
    sha = code_hash({"kind": kind, "definition": definition, "calls": list(code.hashes)})
    if sha in allowed:
        return []
    return [
        Drift(
            kind,
            obj,
            f"{what} runs code fencekit did not generate ({'; '.join(code.reasons)}): {effect}",
            allow_fix(what),
            sha256=sha,
            command=Command(Action.ALLOW, sha256=sha),
        )
    ]


def _expression_code(
    conn: Conn, insp: Inspector, oid: int, rel_sql: str, fence_col: str | None
) -> list[_Found]:
    """Defaults, generated columns, column types, constraints, indexes and (when row-level
    security is on) policies of one relation, with what each runs."""
    out: list[_Found] = []
    for col, generated, tree, text in conn.execute(
        "SELECT a.attname, a.attgenerated <> '', d.adbin::pg_catalog.text, "
        "pg_catalog.pg_get_expr(d.adbin, d.adrelid) FROM pg_catalog.pg_attrdef d "
        "JOIN pg_catalog.pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum "
        "WHERE d.adrelid = %s ORDER BY a.attnum",
        (oid,),
    ).fetchall():
        what = (
            f"the generated column {quote_ident(col)} of {rel_sql}"
            if generated
            else f"the DEFAULT of {'the fence column ' if col == fence_col else 'column '}"
            f"{quote_ident(col)} of {rel_sql}"
        )
        kind = DriftKind.FENCE_DEFAULT_FOREIGN if col == fence_col else DriftKind.FOREIGN_DEFAULT
        out.append((kind, f"{rel_sql}.{col}", what, insp.expression(tree), str(text), _SWAPS))
    for col, typ, typname in conn.execute(
        "SELECT attname, atttypid, atttypid::pg_catalog.regtype::pg_catalog.text "
        "FROM pg_catalog.pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped "
        "ORDER BY attnum",
        (oid,),
    ).fetchall():
        out.append(
            (
                DriftKind.FOREIGN_COLUMN_TYPE,
                f"{rel_sql}.{col}",
                f"the type {typname} of column {quote_ident(col)} of {rel_sql}",
                insp.type_code(int(typ)),
                str(typname),
                "every value written to the column runs it, and it can set fencekit.token",
            )
        )
    for name, contype, tree, definition, excl in conn.execute(
        "SELECT conname, contype::pg_catalog.text, conbin::pg_catalog.text, "
        "pg_catalog.pg_get_constraintdef(oid), conexclop::pg_catalog.oid[] "
        "FROM pg_catalog.pg_constraint WHERE conrelid = %s AND contype IN ('c', 'x') "
        "ORDER BY conname",
        (oid,),
    ).fetchall():
        code = insp.expression(tree)
        if excl:
            code = _merge(code, insp.expression(" ".join(f":opno {o}" for o in excl)))
        out.append(
            (
                DriftKind.FOREIGN_CONSTRAINT,
                f"{rel_sql}: constraint {name}",
                f"the {'CHECK' if contype == 'c' else 'exclusion'} constraint "
                f"{quote_ident(name)} of {rel_sql}",
                code,
                str(definition),
                _SWAPS,
            )
        )
    for name, exprs, pred, classes, definition in conn.execute(
        "SELECT i.indexrelid::pg_catalog.regclass::pg_catalog.text, "
        "i.indexprs::pg_catalog.text, i.indpred::pg_catalog.text, "
        "i.indclass::pg_catalog.oid[], pg_catalog.pg_get_indexdef(i.indexrelid) "
        "FROM pg_catalog.pg_index i WHERE i.indrelid = %s ORDER BY 1",
        (oid,),
    ).fetchall():
        code = _merge(insp.expression(exprs), insp.expression(pred))
        code = _merge(code, _opclass_code(conn, insp, list(classes or [])))
        out.append(
            (
                DriftKind.FOREIGN_INDEX,
                f"{rel_sql}: index {name}",
                f"the index {name} of {rel_sql}",
                code,
                str(definition),
                "every row written runs it, and it can set fencekit.token",
            )
        )
    for name, cmd, qual, check, qual_text, check_text in conn.execute(
        "SELECT p.polname, p.polcmd::pg_catalog.text, p.polqual::pg_catalog.text, "
        "p.polwithcheck::pg_catalog.text, pg_catalog.pg_get_expr(p.polqual, p.polrelid), "
        "pg_catalog.pg_get_expr(p.polwithcheck, p.polrelid) "
        "FROM pg_catalog.pg_policy p JOIN pg_catalog.pg_class c ON c.oid = p.polrelid "
        "WHERE p.polrelid = %s AND c.relrowsecurity ORDER BY p.polname",
        (oid,),
    ).fetchall():
        out.append(
            (
                DriftKind.FOREIGN_POLICY,
                f"{rel_sql}: policy {name}",
                f"the row-level security policy {quote_ident(name)} of {rel_sql}",
                _merge(insp.expression(qual), insp.expression(check)),
                f"{cmd} USING ({qual_text}) WITH CHECK ({check_text})",
                _SWAPS,
            )
        )
    return out


def _rules(
    conn: Conn, oid: int, rel_sql: str, kind: DriftKind = DriftKind.FOREIGN_RULE
) -> list[_Found]:
    """Every enabled rule of a relation but a view's own (_RETURN): a rule rewrites the
    statement itself (runs other statements, or replaces it)."""
    return [
        (
            kind,
            f"{rel_sql}: rule {name}",
            f"the rule {quote_ident(name)} on {rel_sql}",
            _RULE,
            str(definition),
            _RULE_EFFECT,
        )
        for name, definition in conn.execute(
            "SELECT r.rulename, pg_catalog.pg_get_ruledef(r.oid) FROM pg_catalog.pg_rewrite r "
            "WHERE r.ev_class = %s AND r.rulename <> '_RETURN' AND r.ev_enabled <> 'D' "
            "ORDER BY r.rulename",
            (oid,),
        ).fetchall()
    ]


def _merge(a: Code, b: Code) -> Code:
    return Code(
        tuple(dict.fromkeys(a.reasons + b.reasons)), tuple(sorted(set(a.hashes + b.hashes)))
    )


def _opclass_code(conn: Conn, insp: Inspector, classes: list[int]) -> Code:
    """User-defined operator classes of an index: their support functions and operators run
    on every row the index takes."""
    user = [c for c in classes if c >= FIRST_NORMAL_OID]
    if not user:
        return Code(())
    rows = conn.execute(
        "SELECT c.oid::pg_catalog.text, "
        "ARRAY(SELECT p.amproc::pg_catalog.oid FROM pg_catalog.pg_amproc p "
        "       WHERE p.amprocfamily = c.opcfamily), "
        "ARRAY(SELECT o.amopopr FROM pg_catalog.pg_amop o WHERE o.amopfamily = c.opcfamily) "
        "FROM pg_catalog.pg_opclass c WHERE c.oid = ANY(%s) AND NOT EXISTS ("
        "  SELECT FROM pg_catalog.pg_depend d "
        "   WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_opclass'::pg_catalog.regclass "
        "     AND d.objid = c.oid AND d.deptype = 'e')",
        (user,),
    ).fetchall()
    code = Code(())
    for _, procs, ops in rows:
        tree = " ".join([f":funcid {p}" for p in procs] + [f":opno {o}" for o in ops])
        code = _merge(code, insp.expression(tree))
    return code


def _cascade_drift(
    conn: Conn,
    insp: Inspector,
    oid: int,
    rel_sql: str,
    allowed: frozenset[str],
    seen: set[int],
) -> list[Drift]:
    """Foreign keys that cascade a write on this relation (ON DELETE/UPDATE CASCADE, SET NULL,
    SET DEFAULT) into another table, at any depth: its triggers (not fencekit's) and rules run
    inside the writer's statement, and so, when the cascade updates its rows, its defaults,
    constraints, indexes and column types."""
    out: list[Drift] = []
    for con, child, child_oid, updates in conn.execute(
        "SELECT c.conname, c.conrelid::pg_catalog.regclass::pg_catalog.text, c.conrelid, "
        "c.confupdtype IN ('c', 'n', 'd') OR c.confdeltype IN ('n', 'd') "
        "FROM pg_catalog.pg_constraint c WHERE c.confrelid = %s AND c.contype = 'f' "
        "AND (c.confdeltype IN ('c', 'n', 'd') OR c.confupdtype IN ('c', 'n', 'd')) "
        "AND c.conparentid = 0 ORDER BY 1",
        (oid,),
    ).fetchall():
        child_oid = int(child_oid)
        if child_oid in seen:
            continue
        seen.add(child_oid)
        obj = f"{rel_sql}: foreign key {child}.{con}"
        where = (
            f"a write on {rel_sql} cascades through the foreign key {quote_ident(con)} into {child}"
        )
        out += other_triggers(conn, insp, child_oid, DriftKind.FOREIGN_CASCADE, obj, where, allowed)
        found = _rules(conn, child_oid, str(child))
        if updates:
            found += _expression_code(conn, insp, child_oid, str(child), None)
        for _kind, _obj, what, code, definition, effect in found:
            out += _code_drift(
                DriftKind.FOREIGN_CASCADE,
                obj,
                f"{what} ({where})",
                code,
                definition,
                effect,
                allowed,
            )
        out += _cascade_drift(conn, insp, child_oid, str(child), allowed, seen)
    return out


def _view_drift(
    conn: Conn,
    insp: Inspector,
    oid: int,
    rel_sql: str,
    allowed: frozenset[str],
    seen: set[int],
) -> list[Drift]:
    """Views over this relation (at any depth) that run code when written through: INSTEAD
    OF triggers, rules of their own, and functions in their query (an updatable view's WHERE
    becomes the write's)."""
    out: list[Drift] = []
    for view, view_oid, tree, definition in conn.execute(
        "SELECT DISTINCT c.oid::pg_catalog.regclass::pg_catalog.text, c.oid, "
        "r.ev_action::pg_catalog.text, pg_catalog.pg_get_viewdef(c.oid) "
        "FROM pg_catalog.pg_depend d "
        "JOIN pg_catalog.pg_rewrite r ON r.oid = d.objid AND r.rulename = '_RETURN' "
        "JOIN pg_catalog.pg_class c ON c.oid = r.ev_class AND c.relkind = 'v' "
        "WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_rewrite'::pg_catalog.regclass "
        "AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass "
        "AND d.refobjid = %s "
        "ORDER BY 1",
        (oid,),
    ).fetchall():
        view_oid = int(view_oid)
        if view_oid in seen:
            continue
        seen.add(view_oid)
        obj = f"{rel_sql}: view {view}"
        where = f"a write through the view {view} reaches {rel_sql}"
        out += other_triggers(conn, insp, view_oid, DriftKind.FOREIGN_VIEW, obj, where, allowed)
        found = _rules(conn, view_oid, str(view), DriftKind.FOREIGN_VIEW)
        # A view column's DEFAULT runs on every INSERT through the view that omits it.
        for col, tree, text in conn.execute(
            "SELECT a.attname, d.adbin::pg_catalog.text, "
            "pg_catalog.pg_get_expr(d.adbin, d.adrelid) "
            "FROM pg_catalog.pg_attrdef d JOIN pg_catalog.pg_attribute a "
            "ON a.attrelid = d.adrelid AND a.attnum = d.adnum WHERE d.adrelid = %s "
            "ORDER BY a.attnum",
            (view_oid,),
        ).fetchall():
            found.append(
                (
                    DriftKind.FOREIGN_VIEW,
                    obj,
                    f"the DEFAULT of column {quote_ident(col)} of the view {view}",
                    insp.expression(tree),
                    str(text),
                    _SWAPS,
                )
            )
        found.append(
            (
                DriftKind.FOREIGN_VIEW,
                obj,
                f"the view {view} over {rel_sql}",
                insp.expression(tree),
                str(definition),
                "a write through it runs that code: it can set fencekit.token",
            )
        )
        for kind, _obj, what, code, definition_, effect in found:
            out += _code_drift(kind, obj, what, code, definition_, effect, allowed)
        out += _view_drift(conn, insp, view_oid, str(view), allowed, seen)
    return out


# ---------------------------------------------------------------- the catalog walk
#
# The checks above know kinds of objects. PostgreSQL keeps adding kinds (a domain's DEFAULT, a
# range's subtype_diff, a view column's DEFAULT were each missed once), so status also walks
# pg_depend from the table through everything PostgreSQL may run on a write to it, and reports
# every function it reaches that the checks above did not look at: a new kind is found without
# code for it (docs/dev/code-paths.md, "Finding owner code in the catalogs").

_CLASSES = (
    "pg_class",
    "pg_type",
    "pg_proc",
    "pg_constraint",
    "pg_trigger",
    "pg_rewrite",
    "pg_policy",
    "pg_statistic_ext",
    "pg_attrdef",
    "pg_cast",
    "pg_operator",
    "pg_opclass",
)

#: One step of the walk from a frontier of (catalog, object) pairs, as catalog OIDs: the
#: parts of a relation (indexes, constraints, triggers, rules and views over it, policies,
#: statistics, defaults, row type) and of a type (domain constraints, casts, its arrays and
#: multiranges, a composite's relation); what any object uses (functions, types, relations,
#: operators, operator classes; a function only what a BEGIN ATOMIC body calls); inheritance
#: children and partitions; tables whose foreign keys act on it. Only catalogs and built-in
#: types are read, by OID.
_STEP = """
WITH f(c, o) AS (
  SELECT * FROM ROWS FROM (pg_catalog.unnest(%(c)s::pg_catalog.oid[]),
                           pg_catalog.unnest(%(o)s::pg_catalog.oid[]))
)
SELECT f.c, f.o, d.classid, d.objid FROM f JOIN pg_catalog.pg_depend d
    ON d.refclassid OPERATOR(pg_catalog.=) f.c AND d.refobjid OPERATOR(pg_catalog.=) f.o
 WHERE (f.c OPERATOR(pg_catalog.=) %(pg_class)s AND d.deptype IN ('a', 'i', 'n')
        AND d.classid OPERATOR(pg_catalog.=) ANY (%(rel_parts)s::pg_catalog.oid[]))
    OR (f.c OPERATOR(pg_catalog.=) %(pg_type)s
        AND (d.classid OPERATOR(pg_catalog.=) ANY (%(type_parts)s::pg_catalog.oid[])
             OR (d.classid OPERATOR(pg_catalog.=) %(pg_class)s AND d.deptype = 'i')))
UNION ALL
SELECT f.c, f.o, d.refclassid, d.refobjid FROM f JOIN pg_catalog.pg_depend d
    ON d.classid OPERATOR(pg_catalog.=) f.c AND d.objid OPERATOR(pg_catalog.=) f.o
 WHERE d.deptype IN ('n', 'a', 'i')
   AND d.refclassid OPERATOR(pg_catalog.=) ANY (%(used)s::pg_catalog.oid[])
   AND (f.c OPERATOR(pg_catalog.<>) %(pg_proc)s OR d.refclassid OPERATOR(pg_catalog.=) %(pg_proc)s)
UNION ALL
SELECT f.c, f.o, %(pg_class)s, i.inhrelid FROM f JOIN pg_catalog.pg_inherits i
    ON f.c OPERATOR(pg_catalog.=) %(pg_class)s AND i.inhparent OPERATOR(pg_catalog.=) f.o
UNION ALL
SELECT f.c, f.o, %(pg_class)s, k.conrelid FROM f JOIN pg_catalog.pg_constraint k
    ON f.c OPERATOR(pg_catalog.=) %(pg_class)s AND k.confrelid OPERATOR(pg_catalog.=) f.o
   AND k.contype = 'f'
"""


def _catalog_oids(conn: Conn) -> dict[str, int]:
    rows = conn.execute(
        "SELECT c.relname, c.oid FROM pg_catalog.pg_class c "
        "WHERE c.relnamespace OPERATOR(pg_catalog.=) 11 AND c.relname = ANY(%s)",
        (list(_CLASSES),),
    ).fetchall()
    return {str(n): int(o) for n, o in rows}


def reachable_functions(conn: Conn, oid: int) -> dict[int, list[tuple[int, int]]]:
    """Every function (not built in) the catalogs link to relation ``oid``, with the path of
    (catalog, object) pairs that reaches it."""
    cat = _catalog_oids(conn)
    params: dict[str, object] = {
        "pg_class": cat["pg_class"],
        "pg_type": cat["pg_type"],
        "pg_proc": cat["pg_proc"],
        "rel_parts": [
            cat[n]
            for n in (
                "pg_class",
                "pg_constraint",
                "pg_trigger",
                "pg_rewrite",
                "pg_policy",
                "pg_statistic_ext",
                "pg_attrdef",
                "pg_type",
            )
        ],
        "type_parts": [cat[n] for n in ("pg_constraint", "pg_cast", "pg_type")],
        "used": [cat[n] for n in ("pg_proc", "pg_type", "pg_class", "pg_operator", "pg_opclass")],
    }
    start = (cat["pg_class"], oid)
    parent: dict[tuple[int, int], tuple[int, int] | None] = {start: None}
    frontier = [start]
    while frontier:
        rows = conn.execute(
            _STEP, {**params, "c": [c for c, _ in frontier], "o": [o for _, o in frontier]}
        ).fetchall()
        frontier = []
        for sc, so, dc, do in rows:
            node = (int(dc), int(do))
            if node not in parent:
                parent[node] = (int(sc), int(so))
                frontier.append(node)
    out: dict[int, list[tuple[int, int]]] = {}
    for node in parent:
        if node[0] != cat["pg_proc"] or node[1] < FIRST_NORMAL_OID:
            continue
        path: list[tuple[int, int]] = []
        step: tuple[int, int] | None = node
        while step is not None:
            path.append(step)
            step = parent[step]
        out[node[1]] = path[::-1]
    return out


def _describe(conn: Conn, path: list[tuple[int, int]]) -> str:
    """A path of catalog objects, for people (pg_describe_object)."""
    rows = conn.execute(
        "SELECT pg_catalog.pg_describe_object(x.c, x.o, 0) FROM ROWS FROM ("
        "pg_catalog.unnest(%s::pg_catalog.oid[]), pg_catalog.unnest(%s::pg_catalog.oid[])) "
        "WITH ORDINALITY AS x(c, o, n) ORDER BY x.n",
        ([c for c, _ in path], [o for _, o in path]),
    ).fetchall()
    return " -> ".join(str(r[0]) for r in rows)


def unknown_code_drift(
    conn: Conn, insp: Inspector, oid: int, rel_sql: str, allowed: frozenset[str]
) -> list[Drift]:
    """Functions the catalogs link to relation ``oid`` that no check above looked at (call
    after them, with ``insp`` started for this table): neither built in, nor fencekit's own,
    nor a superuser-owned extension's."""
    out: list[Drift] = []
    reached = reachable_functions(conn, oid)
    unknown = [o for o in reached if o not in insp.looked_at]
    for f_oid in unknown:
        f = insp.function(f_oid)
        if f is None or not (f.user or f.risky):
            continue
        how = _describe(conn, reached[f_oid])
        out += _code_drift(
            DriftKind.FOREIGN_CODE,
            f"{rel_sql}: {f.name}",
            f"{f.name}, which the catalogs link to {rel_sql} ({how})",
            Code((f"calls {f.name}",), (f.sha256,)),
            how,
            "PostgreSQL may run it on a write to the table; it can set fencekit.token",
            allowed,
        )
    return out
