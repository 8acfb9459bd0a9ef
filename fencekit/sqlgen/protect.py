"""Protect and unprotect one table: the per-scope objects assembled into idempotent DDL.

Re-running protect is a no-op on a current table and an in-place upgrade on any other: every
trigger whose stamp differs is replaced, and every ``fencekit_<tag>_*`` trigger or
``fencekit.<tag>_*`` function that the current template does not make is dropped. Partitions
and inheritance children that exist when protect runs are covered too.
"""

from __future__ import annotations

import hashlib
import json

from fencekit.ident import quote_ident
from fencekit.spec import FenceSpec, Scope
from fencekit.sqlgen.common import PINNED_SEARCH_PATH, Names, lit_lines, names_for, spec_jsonb
from fencekit.sqlgen.key import key_objects
from fencekit.sqlgen.objects import TEMPLATE_VERSION, Function, TableObjects, Trigger, stamp
from fencekit.sqlgen.row import FENCE_DEFAULT, row_objects
from fencekit.sqlgen.statement import statement_objects
from fencekit.sqlgen.text import do, dollar, lit

__all__ = [
    "add_column_quietly",
    "drop_objects",
    "protect_statements",
    "table_objects",
    "trigger_stamp",
    "unprotect_statements",
]


def table_objects(spec: FenceSpec) -> TableObjects:
    """The functions and triggers that protect ``spec.table``."""
    n = names_for(spec)
    functions, triggers = statement_objects(n)
    if spec.scope is Scope.ROW:
        more = row_objects(n)
    elif spec.scope is Scope.KEY:
        more = key_objects(n, functions[0])
    else:
        more = ([], [])
    triggers += [*more[1], root_guard(n, functions[0])]
    partial = TableObjects(spec, TEMPLATE_VERSION, n.tag, (), tuple(triggers))
    functions += [*more[0], cover_function(partial, n)]
    return TableObjects(spec, TEMPLATE_VERSION, n.tag, tuple(functions), tuple(triggers))


def root_guard(n: Names, function: Function) -> Trigger:
    """A trigger that keeps the protected table from becoming a child of another table.

    PostgreSQL fires a table's statement triggers only for statements that name it, so a
    protected table made an inheritance child (``ALTER TABLE t INHERIT other``) or a partition
    (``ATTACH PARTITION``) of a table fencekit does not protect would take writes through that
    parent without its statement checks. PostgreSQL refuses both for a table with a row trigger
    that has a transition table; this one is never queued (``WHEN (false)``) and never runs. It
    uses DELETE, whose transition rows a key fence captures anyway. PostgreSQL allows it only
    on a plain table that has no parent yet: a partitioned table or a table already a child
    goes without (status reports a protected table with an unprotected ancestor)."""
    return Trigger(
        n.trigger("root"),
        "AFTER DELETE",
        "ROW",
        function,
        when="false",
        referencing="OLD TABLE AS fencekit_old",
        root_only=True,
    )


def create_trigger_sql(trigger: Trigger, on: str) -> str:
    middle = f"FOR EACH {trigger.level}"
    if trigger.referencing:
        middle = f"REFERENCING {trigger.referencing} {middle}"
    if trigger.when:
        middle += f" WHEN ({trigger.when})"
    timing = trigger.timing
    if trigger.columns:
        timing += "\n  OF " + ", ".join(quote_ident(c) for c in trigger.columns)
    return (
        f"CREATE TRIGGER {quote_ident(trigger.name)} {timing} ON {on}\n"
        f"  {middle}\n  EXECUTE FUNCTION {trigger.function.sql_name}()"
    )


def _format_template(trigger: Trigger) -> str:
    """CREATE OR REPLACE TRIGGER as a format() template whose only placeholder is the table (a
    name in a WHEN clause may hold a %)."""
    sql = create_trigger_sql(trigger, "\x00")
    sql = sql.replace("CREATE TRIGGER", "CREATE OR REPLACE TRIGGER", 1)
    return sql.replace("%", "%%").replace("\x00", "%s")


def trigger_stamp(trigger: Trigger) -> str:
    digest = hashlib.sha256(create_trigger_sql(trigger, "").encode()).hexdigest()
    return stamp("trigger", f" sha256={digest}")


def _create_function_sql(f: Function) -> list[str]:
    attrs = "".join(f"\nSET {name} TO {value}" for name, value in f.settings)
    out = [
        f"CREATE OR REPLACE FUNCTION {f.sql_name}() RETURNS {f.returns}\n"
        f"LANGUAGE plpgsql{' SECURITY DEFINER' if f.definer else ''}{attrs}\n"
        f"AS {dollar(f.body, 'fn')}",
        f"COMMENT ON FUNCTION {f.sql_name}() IS\n  "
        + lit_lines(stamp("function", f" sha256={f.body_hash}"), "  "),
    ]
    return out


def _grants_sql(functions: tuple[Function, ...]) -> list[str]:
    # Trigger functions fire whatever EXECUTE says, cannot be called directly, and CREATE
    # TRIGGER needs EXECUTE: with it kept from PUBLIC, nobody but the owner and fencekit_admin
    # can attach a definer function (and its rights) to another table, and a trigger calling a
    # fencekit.<tag>_* function marks a table as the one protected under <tag>
    # (fencekit.writing relies on that).
    names = ",\n  ".join(f"{f.sql_name}()" for f in functions)
    return [
        f"REVOKE ALL ON FUNCTION\n  {names}\n  FROM PUBLIC",
        f"GRANT EXECUTE ON FUNCTION\n  {names}\n  TO fencekit_admin",
    ]


def _partitioned_functions_sql(functions: tuple[Function, ...], table: str) -> str:
    """A DO block that makes ``functions`` (and their grants) only when ``table`` is
    partitioned: like the triggers that call them (Trigger.partitioned_only), they have no
    use anywhere else."""
    statements = [s for f in functions for s in _create_function_sql(f)]
    statements += _grants_sql(functions)
    body = "".join(f"    EXECUTE {dollar(s, 'sql')};\n" for s in statements)
    return do(
        "\nBEGIN\n"
        "  IF EXISTS (SELECT FROM pg_catalog.pg_class c\n"
        f"              WHERE c.oid = {lit(table)}::pg_catalog.regclass AND c.relkind = 'p') THEN\n"
        + body
        + "  END IF;\nEND\n"
    )


def _guard(spec: FenceSpec) -> str:
    """Refuse fencekit's own tables, and a structural change over an existing protection
    (``fencekit.protect_guard``, 47_protect.sql).

    Policies (on_missing, on_equal, lease_bound, issuer) change by re-running protect; another
    scope, key, resource or fence column would strand fences and columns: that is a move
    (:mod:`fencekit.sqlgen.move`), whose script removes the registry row before it protects.
    """
    d = spec.as_dict()
    structure = {k: d[k] for k in ("scope", "key", "resource", "column")}
    # One option a line past the first: a long key list keeps the line short.
    text = json.dumps(structure, sort_keys=True).replace(', "key"', ',\n   "key"')
    return (
        f"SELECT fencekit.protect_guard({lit(spec.table.sql)}::pg_catalog.regclass,\n"
        f"  {lit(text)}::pg_catalog.jsonb)"
    )


def _ensure(tr: Trigger, on: str) -> str:
    """SQL: ``fencekit.ensure_trigger`` for ``tr`` on ``on`` (an expression yielding a
    regclass): created, or replaced whatever is there (47_protect.sql)."""
    return (
        f"fencekit.ensure_trigger({on}, {lit(tr.name)},\n"
        f"      {lit_lines(trigger_stamp(tr), '      ')},\n"
        f"      {lit(_format_template(tr))})"
    )


def _drop_foreign_generations(n: Names, keep: set[str], on: str) -> str:
    """SQL: drop the ``fencekit_<tag>_*`` triggers on ``on`` that this template does not make
    (another release made them): re-protect must not leave an old trigger firing."""
    keep_sql = ",\n         ".join(lit(k) for k in sorted(keep))
    return (
        f"fencekit.drop_other_triggers({on}, {lit(f'fencekit_{n.tag}_')},\n"
        f"         ARRAY[{keep_sql}])"
    )


_DESCENDANTS = (
    "WITH RECURSIVE d(relid) AS (\n"
    "      SELECT i.inhrelid FROM pg_catalog.pg_inherits i WHERE i.inhparent = {root}\n"
    "      UNION\n"
    "      SELECT i.inhrelid FROM pg_catalog.pg_inherits i JOIN d ON i.inhparent = d.relid)\n"
    "    SELECT c.oid::pg_catalog.regclass, c.relispartition FROM d\n"
    "      JOIN pg_catalog.pg_class c ON c.oid = d.relid WHERE c.relkind IN ('r', 'p')"
)


def cover_function(objs: TableObjects, n: Names) -> Function:
    """``fencekit.<tag>_cover()``: put the table's triggers on every partition and inheritance
    child that lacks them, and drop the ``fencekit_<tag>_*`` triggers its template does not
    make (``fencekit.cover_descendants`` and ``fencekit.cover_trigger``, 47_protect.sql).
    Protect calls it; so does the optional auto-cover event trigger when a child is created or
    attached later (PostgreSQL fires a parent's statement triggers only for statements naming
    the parent, and clones row triggers to partitions but not to inheritance children). Each
    trigger's definition is written here by the generator, as the protect script writes the
    root's: nothing is read back from the catalogs and made into SQL."""
    root = f"{lit(objs.spec.table.sql)}::pg_catalog.regclass"
    keep = ",\n          ".join(lit(tr.name) for tr in objs.triggers)
    calls = {False: "", True: ""}
    for tr in objs.triggers:
        # The root guard stays on the root; the row checks of rows crossing partitions reach
        # partitions as PostgreSQL's clones (a partitioned tree has no inheritance child); a
        # row trigger with transition tables cannot go on a child.
        row = tr.level == "ROW"
        if tr.root_only or (row and (tr.partitioned_only or tr.referencing)):
            continue
        on_rows = "true" if row else "false"
        pad = "    " if tr.partitioned_only else "  "
        calls[tr.partitioned_only] += (
            f"{pad}PERFORM fencekit.cover_trigger({root},\n"
            f"{pad}  {lit(tr.name)},\n"
            f"{pad}  {lit_lines(trigger_stamp(tr), pad + '  ')},\n"
            f"{pad}  {lit(_format_template(tr))}, {on_rows});\n"
        )
    partitioned = ""
    if calls[True]:
        partitioned = (
            "  IF EXISTS (SELECT FROM pg_catalog.pg_class c\n"
            f"              WHERE c.oid = {root} AND c.relkind = 'p') THEN\n"
            + calls[True]
            + "  END IF;\n"
        )
    body = (
        "\n" + n.title("partition and child coverage") + "BEGIN\n"
        f"  PERFORM fencekit.cover_descendants({root}, {lit(f'fencekit_{n.tag}_')},\n"
        f"    ARRAY[{keep}]);\n" + calls[False] + partitioned + "END\n"
    )
    # Not on the hot path (protect and the auto-cover event trigger call it): it pins its
    # search_path rather than qualify every operator.
    return n.function("cover", body, returns="void", settings=(PINNED_SEARCH_PATH,))


def _triggers_sql(objs: TableObjects, n: Names) -> list[str]:
    """The table's triggers (plain DDL, replaced in place on a re-run), its descendants' (the
    cover function), then the functions of another generation dropped."""
    t = objs.spec.table
    root = f"{lit(t.sql)}::pg_catalog.regclass"
    keep = {tr.name for tr in objs.triggers}
    keep_functions = ",\n         ".join(lit(f.name) for f in objs.functions)
    cover = next(f for f in objs.functions if f.returns == "void")
    out = []
    for tr in objs.triggers:
        if tr.root_only or tr.partitioned_only:
            continue
        out.append(
            create_trigger_sql(tr, t.sql).replace("CREATE TRIGGER", "CREATE OR REPLACE TRIGGER", 1)
        )
        out.append(
            f"COMMENT ON TRIGGER {quote_ident(tr.name)} ON {t.sql} IS\n  "
            + lit_lines(trigger_stamp(tr), "  ")
        )
    for tr in objs.triggers:
        if tr.root_only:
            # Only where PostgreSQL allows it: see root_guard.
            out.append(
                f"SELECT {_ensure(tr, 'c.oid::pg_catalog.regclass')}\n"
                f"  FROM pg_catalog.pg_class c\n"
                f" WHERE c.oid = {root} AND c.relkind = 'r' AND NOT c.relispartition\n"
                "   AND NOT EXISTS (SELECT FROM pg_catalog.pg_inherits i WHERE i.inhrelid = c.oid)"
            )
        elif tr.partitioned_only:
            out.append(
                f"SELECT {_ensure(tr, 'c.oid::pg_catalog.regclass')}\n"
                f"  FROM pg_catalog.pg_class c WHERE c.oid = {root} AND c.relkind = 'p'"
            )
    out.append(f"SELECT {cover.sql_name}()")
    # What an older template made and this one does not: dropped, so none keeps firing.
    out.append(
        f"SELECT {_drop_foreign_generations(n, keep, root)},\n"
        f"       fencekit.drop_other_functions({lit(f'{n.tag}_')},\n"
        f"         ARRAY[{keep_functions}])"
    )
    return out


def protect_statements(spec: FenceSpec) -> list[str]:
    """Statements that protect a table, without transaction control; idempotent."""
    objs = table_objects(spec)
    n = names_for(spec)
    t = spec.table
    out: list[str] = [_guard(spec)]
    if spec.scope is Scope.ROW:
        # Nullable, and a default only new rows use: catalog-only changes, no table rewrite.
        out.append(add_column_quietly(spec))
        out.append(f"ALTER TABLE {t.sql} ALTER COLUMN {n.col} SET DEFAULT\n  {FENCE_DEFAULT}")
        out.append(
            f"COMMENT ON COLUMN {t.sql}.{n.col} IS\n  "
            + lit("fencekit: the fence of this row (highest token accepted); managed by fencekit")
        )
    if spec.scope is Scope.KEY:
        keys = ", ".join(lit(k) for k in spec.key)
        out.append(
            f"SELECT fencekit.check_key_columns({lit(t.sql)}::pg_catalog.regclass,\n"
            f"  ARRAY[{keys}], {n.resource})"
        )
    if spec.resource is not None or spec.issuer is not None:
        issuer = lit(spec.issuer) if spec.issuer else "NULL"
        out.append(f"SELECT fencekit.bind_resource({n.resource}, {issuer})")
    out.append(create_counters_quietly(n.tag))
    everywhere = tuple(f for f in objs.functions if not f.partitioned_only)
    for f in everywhere:
        out += _create_function_sql(f)
        if f.table_owner:
            # Reads the table: runs as its owner, whose code that read runs (objects.Function).
            out.append(
                "SELECT fencekit.give_to_table_owner("
                f"{lit(f.sql_name + '()')}::pg_catalog.regprocedure,\n"
                f"  {lit(t.sql)}::pg_catalog.regclass)"
            )
    out += _grants_sql(everywhere)
    partitioned = tuple(f for f in objs.functions if f.partitioned_only)
    if partitioned:
        out.append(_partitioned_functions_sql(partitioned, t.sql))
    out += _triggers_sql(objs, n)
    resource = n.resource if spec.scope is not Scope.ROW else "NULL"
    families = "NULL"
    if spec.scope is Scope.KEY:
        keys = ", ".join(lit(k) for k in spec.key)
        families = f"fencekit.key_families({lit(t.sql)}::pg_catalog.regclass, ARRAY[{keys}])"
    out.append(
        f"SELECT fencekit.register_table({lit(t.schema)}, {lit(t.name)}, {n.lit_tag}, "
        f"{resource},\n  {spec_jsonb(spec)},\n  {TEMPLATE_VERSION}, {families})"
    )
    return out


def unprotect_statements(spec: FenceSpec) -> list[str]:
    """The exact undo of :func:`protect_statements`, without transaction control.

    It first checks that the registry holds exactly ``spec`` for the table (a script generated
    with other options would strand fences or drop the wrong column), then drops every
    ``fencekit_<tag>_*`` trigger on the table and its descendants and every
    ``fencekit.<tag>_*`` trigger function, whichever generation made them.
    """
    n = names_for(spec)
    t = spec.table
    # to_regclass: unprotecting a table that was dropped still cleans up fencekit's side.
    root = f"pg_catalog.to_regclass({lit(t.sql)})"
    out: list[str] = [unprotect_guard(spec), drop_objects(n.tag, root)]
    if spec.scope is Scope.ROW:
        out.append(f"ALTER TABLE IF EXISTS {t.sql} DROP COLUMN IF EXISTS {n.col}")
    out.append(f"SELECT fencekit.drop_counters({n.lit_tag})")
    # Who wrote it without a token, and the log's mark, which counts the appends of the
    # counters just dropped: a protect that follows starts them again from 1.
    for attribution in ("unfenced_writers", "unfenced_overflow", "unfenced_log",
                        "unfenced_log_folded"):  # fmt: skip
        out.append(f"DELETE FROM fencekit.{attribution} WHERE tag = {n.lit_tag}")
    out.append(
        f"DELETE FROM fencekit.protected WHERE schema_name = {lit(t.schema)} "
        f"AND table_name = {lit(t.name)}"
    )
    if spec.scope is not Scope.ROW:
        # A named resource shared with other tables keeps its fences.
        unused = f"NOT EXISTS (SELECT FROM fencekit.protected WHERE resource = {n.resource})"
        out.append(f"DELETE FROM fencekit.fences WHERE resource = {n.resource}\n  AND {unused}")
        out.append(f"DELETE FROM fencekit.floors WHERE resource = {n.resource}\n  AND {unused}")
    if spec.resource is not None or spec.issuer is not None:
        out.append(
            f"DELETE FROM fencekit.resources WHERE resource = {n.resource}\n"
            f"  AND NOT EXISTS (SELECT FROM fencekit.protected WHERE resource = {n.resource})"
        )
    return out


def drop_objects(tag: str, root: str) -> str:
    """A DO block dropping the ``fencekit_<tag>_*`` triggers on ``root`` (a SQL expression
    yielding a regclass or NULL) and its descendants, then the ``fencekit.<tag>_*`` functions:
    those ``fencekit.named_by`` gives the table, not another's whose tag starts with its own;
    and every trigger calling one of those functions, whatever its name."""
    prefix = f"fencekit_{tag}_"
    fn_prefix = f"{tag}_"
    return do(
        "\nDECLARE\n  rel pg_catalog.regclass;\n  is_partition pg_catalog.bool;\n"
        "  old pg_catalog.name;\nBEGIN\n"
        f"  IF {root} IS NOT NULL THEN\n"
        f"    FOR rel, is_partition IN SELECT {root}, false UNION ALL\n"
        f"        ({_DESCENDANTS.format(root=root)}) LOOP\n"
        "      FOR old IN SELECT tg.tgname FROM pg_catalog.pg_trigger tg\n"
        "                  WHERE tg.tgrelid = rel AND NOT tg.tgisinternal\n"
        "                    AND tg.tgparentid = 0\n"
        "                    AND (fencekit.named_by(tg.tgname::pg_catalog.text,\n"
        f"                                           {lit(prefix)})\n"
        "                         OR EXISTS (SELECT FROM pg_catalog.pg_proc p\n"
        "                                     WHERE p.oid OPERATOR(pg_catalog.=) tg.tgfoid\n"
        "                                       AND p.pronamespace OPERATOR(pg_catalog.=)\n"
        "                                           'fencekit'::pg_catalog.regnamespace\n"
        "                                       AND fencekit.named_by(p.proname::pg_catalog.text,\n"
        f"                                                             {lit(fn_prefix)}))) LOOP\n"
        "        EXECUTE pg_catalog.format('DROP TRIGGER %I ON %s', old, rel);\n"
        "      END LOOP;\n"
        "    END LOOP;\n"
        "  END IF;\n"
        "  FOR old IN SELECT p.proname FROM pg_catalog.pg_proc p\n"
        "              WHERE p.pronamespace = 'fencekit'::pg_catalog.regnamespace\n"
        "                AND p.pronargs = 0\n"
        "                AND fencekit.named_by(p.proname::pg_catalog.text,\n"
        f"                                      {lit(fn_prefix)}) LOOP\n"
        "    EXECUTE pg_catalog.format('DROP FUNCTION fencekit.%I()', old);\n"
        "  END LOOP;\n"
        "END\n"
    )


def add_column_quietly(spec: FenceSpec) -> str:
    """Add a row fence's column unless it exists (``fencekit.add_fence_column``: ``ADD COLUMN
    IF NOT EXISTS`` would print a NOTICE on every re-run, and a re-run is meant to be quiet)."""
    return (
        f"SELECT fencekit.add_fence_column({lit(spec.table.sql)}::pg_catalog.regclass, "
        f"{lit(spec.column)}::pg_catalog.name)"
    )


def create_counters_quietly(tag: str) -> str:
    """``fencekit.create_counters(tag)`` only while one of its sequences is missing
    (``fencekit.ensure_counters``: the other prints a NOTICE per existing sequence)."""
    return f"SELECT fencekit.ensure_counters({lit(tag)})"


def unprotect_guard(spec: FenceSpec) -> str:
    """Refuse (YF000) unless the registry holds exactly ``spec`` for the table, with a hint
    naming the command that generates the right script; a table the registry does not know
    gets a NOTICE, and the script then only cleans leftovers (``fencekit.unprotect_guard``,
    48_guards.sql). It first refuses a partitioned table whose partition key runs the owner's
    code when the session is not the owner's (DROP COLUMN loads the key; 47_protect.sql)."""
    return f"SELECT fencekit.unprotect_guard({lit(spec.table.sql)},\n  {spec_jsonb(spec)})"
