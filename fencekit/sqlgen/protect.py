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
from fencekit.spec import DEFAULT_COLUMN, FenceSpec, Scope
from fencekit.sqlgen.common import Names, names_for
from fencekit.sqlgen.key import key_objects
from fencekit.sqlgen.objects import TEMPLATE_VERSION, Function, TableObjects, Trigger, stamp
from fencekit.sqlgen.row import FENCE_DEFAULT, row_objects
from fencekit.sqlgen.statement import statement_objects
from fencekit.sqlgen.text import do, dollar, lit

__all__ = [
    "add_column_quietly",
    "create_counters_quietly",
    "drop_objects",
    "protect_statements",
    "shell_args_sql",
    "table_objects",
    "trigger_stamp",
    "unprotect_guard",
    "unprotect_statements",
]


def table_objects(spec: FenceSpec) -> TableObjects:
    """The functions and triggers that protect ``spec.table``."""
    n = names_for(spec)
    functions, triggers = statement_objects(n)
    if spec.scope is Scope.ROW:
        more = row_objects(n)
    elif spec.scope is Scope.KEY:
        more = key_objects(n)
    else:
        more = ([], [])
    triggers += more[1]
    partial = TableObjects(spec, TEMPLATE_VERSION, n.tag, (), tuple(triggers))
    functions += [*more[0], cover_function(partial, n)]
    return TableObjects(spec, TEMPLATE_VERSION, n.tag, tuple(functions), tuple(triggers))


def create_trigger_sql(trigger: Trigger, on: str) -> str:
    parts = [f"CREATE TRIGGER {quote_ident(trigger.name)} {trigger.timing} ON {on}"]
    if trigger.referencing:
        parts.append(f"REFERENCING {trigger.referencing}")
    parts.append(f"FOR EACH {trigger.level}")
    if trigger.when:
        parts.append(f"WHEN ({trigger.when})")
    parts.append(f"EXECUTE FUNCTION {trigger.function.sql_name}()")
    return "\n      ".join(parts)


def _format_template(trigger: Trigger) -> str:
    """CREATE TRIGGER as a format() template whose only placeholder is the table (a name in a
    WHEN clause may hold a %)."""
    return create_trigger_sql(trigger, "\x00").replace("%", "%%").replace("\x00", "%s")


def trigger_stamp(trigger: Trigger) -> str:
    digest = hashlib.sha256(create_trigger_sql(trigger, "").encode()).hexdigest()
    return stamp("trigger", f" sha256={digest}")


def _create_function_sql(f: Function) -> list[str]:
    attrs = "".join(f"\nSET {name} TO {value}" for name, value in f.settings)
    out = [
        f"CREATE OR REPLACE FUNCTION {f.sql_name}() RETURNS {f.returns}\n"
        f"LANGUAGE plpgsql{' SECURITY DEFINER' if f.definer else ''}{attrs}\n"
        f"AS {dollar(f.body, 'fn')}",
        f"COMMENT ON FUNCTION {f.sql_name}() IS "
        + lit(stamp("function", f" sha256={f.body_hash}")),
    ]
    # Trigger functions fire whatever EXECUTE says, cannot be called directly, and CREATE
    # TRIGGER needs EXECUTE: with it kept from PUBLIC, nobody but the owner and fencekit_admin
    # can attach a definer function (and its rights) to another table, and a trigger calling a
    # fencekit.<tag>_* function marks a table as the one protected under <tag>
    # (fencekit.writing relies on that).
    out.append(f"REVOKE ALL ON FUNCTION {f.sql_name}() FROM PUBLIC")
    out.append(f"GRANT EXECUTE ON FUNCTION {f.sql_name}() TO fencekit_admin")
    return out


def _guard(spec: FenceSpec) -> str:
    """Refuse fencekit's own tables, and a structural change over an existing protection.

    Policies (on_missing, on_equal, lease_bound, issuer) change by re-running protect; another
    scope, key, resource or fence column would strand fences and columns: that is a move
    (:mod:`fencekit.sqlgen.move`), whose script removes the registry row before it protects.
    """
    t = spec.table
    d = spec.as_dict()
    structure = ("scope", "key", "resource", "column")
    current = ", ".join(f"p.spec -> {lit(k)}" for k in structure)
    wanted = ", ".join(f"{lit(json.dumps(d[k]))}::pg_catalog.jsonb" for k in structure)
    message = (
        f"fencekit: {t.sql} is already protected with another scope, key, resource or fence column"
    )
    return do(
        "\nBEGIN\n"
        "  IF (SELECT c.relnamespace FROM pg_catalog.pg_class c\n"
        f"       WHERE c.oid = {lit(t.sql)}::pg_catalog.regclass)\n"
        "     OPERATOR(pg_catalog.=) 'fencekit'::pg_catalog.regnamespace THEN\n"
        "    RAISE EXCEPTION USING ERRCODE = 'YF000',\n"
        "      MESSAGE = 'fencekit: fencekit''s own tables cannot be protected',\n"
        "      HINT = 'Only the DBA and fencekit_admin write them; protect your own tables.';\n"
        "  END IF;\n"
        "  IF EXISTS (SELECT FROM fencekit.protected p\n"
        f"             WHERE p.schema_name OPERATOR(pg_catalog.=) {lit(t.schema)}"
        f" AND p.table_name OPERATOR(pg_catalog.=) {lit(t.name)}\n"
        f"               AND ({current})\n"
        f"                   IS DISTINCT FROM ({wanted})) THEN\n"
        "    RAISE EXCEPTION USING ERRCODE = 'YF000',\n"
        f"      MESSAGE = {lit(message)},\n"
        "      HINT = 'Move it in one transaction, fences carried: fencekit move TABLE "
        "<new options> --dsn DSN, fencekit sql move, or alembic op.move_fence; policies alone "
        "change by re-running protect.';\n"
        "  END IF;\nEND\n"
    )


# The reason every EXECUTE in PL/pgSQL states (tests/security/test_plpgsql_check.py).
_DYNAMIC = "-- dynamic SQL: the table or child is known only at run time (a regclass: quoted)"


def _ensure_triggers(triggers: list[Trigger], on: str, indent: str) -> str:
    """PL/pgSQL ensuring ``triggers`` on ``on`` (a SQL expression yielding the regclass):
    replace one whose stamp differs, create one that is missing."""
    i = indent
    out = ""
    for tr in triggers:
        name = lit(tr.name)
        st = lit(trigger_stamp(tr))
        out += (
            f"{i}IF EXISTS (SELECT FROM pg_catalog.pg_trigger t WHERE t.tgrelid = {on}\n"
            f"{i}           AND t.tgname = {name}\n"
            f"{i}           AND pg_catalog.obj_description(t.oid, 'pg_trigger') IS DISTINCT FROM\n"
            f"{i}               {st}) THEN\n"
            f"{i}  {_DYNAMIC}\n"
            f"{i}  EXECUTE pg_catalog.format('DROP TRIGGER %I ON %s', {name}, {on});\n"
            f"{i}END IF;\n"
            f"{i}IF NOT EXISTS (SELECT FROM pg_catalog.pg_trigger t\n"
            f"{i}               WHERE t.tgrelid = {on} AND t.tgname = {name}) THEN\n"
            f"{i}  {_DYNAMIC}\n"
            f"{i}  EXECUTE pg_catalog.format({lit(_format_template(tr))}, {on});\n"
            f"{i}  EXECUTE pg_catalog.format('COMMENT ON TRIGGER %I ON %s IS %L', {name}, {on}, "
            f"{st});\n"
            f"{i}END IF;\n"
        )
    return out


def _drop_foreign_generations(n: Names, keep: set[str], on: str, indent: str) -> str:
    """PL/pgSQL dropping ``fencekit_<tag>_*`` triggers on ``on`` that this template does not
    make (another release made them): re-protect must not leave an old trigger firing."""
    i = indent
    prefix = f"fencekit_{n.tag}_"
    keep_sql = ", ".join(lit(k) for k in sorted(keep))
    return (
        f"{i}FOR old IN SELECT t.tgname FROM pg_catalog.pg_trigger t\n"
        f"{i}            WHERE t.tgrelid = {on} AND NOT t.tgisinternal AND t.tgparentid = 0\n"
        f"{i}              AND pg_catalog.left(t.tgname::pg_catalog.text, {len(prefix)})\n"
        f"{i}                  OPERATOR(pg_catalog.=) {lit(prefix)}\n"
        f"{i}              AND t.tgname::pg_catalog.text OPERATOR(pg_catalog.<>) ALL "
        f"(ARRAY[{keep_sql}]) LOOP\n"
        f"{i}  {_DYNAMIC}\n"
        f"{i}  EXECUTE pg_catalog.format('DROP TRIGGER %I ON %s', old, {on});\n"
        f"{i}END LOOP;\n"
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
    child that lacks them. Protect calls it; so does the optional auto-cover event trigger
    when a child is created or attached later (PostgreSQL fires a parent's statement triggers
    only for statements naming the parent, and clones row triggers to partitions but not to
    inheritance children)."""
    root = f"{lit(objs.spec.table.sql)}::pg_catalog.regclass"
    keep = {tr.name for tr in objs.triggers}
    statement = [tr for tr in objs.triggers if tr.on_partitions]
    row = [tr for tr in objs.triggers if not tr.on_partitions]
    body = (
        "\n" + n.title("partition and child coverage") + "DECLARE\n"
        "  old pg_catalog.name;\n"
        "  child pg_catalog.regclass;\n"
        "  is_partition pg_catalog.bool;\n"
        "BEGIN\n"
        f"  FOR child, is_partition IN {_DESCENDANTS.format(root=root)} LOOP\n"
        + _drop_foreign_generations(n, keep, "child", "    ")
        + _ensure_triggers(statement, "child", "    ")
        + "    IF NOT is_partition THEN\n"
        + _ensure_triggers(row, "child", "      ")
        + "    END IF;\n"
        "  END LOOP;\n"
        "END\n"
    )
    return n.function("cover", body, returns="void")


def _triggers_sql(objs: TableObjects, n: Names) -> str:
    """One DO block: the table's triggers, its descendants' (the cover function), then the
    functions of another generation."""
    t = objs.spec.table
    root = f"{lit(t.sql)}::pg_catalog.regclass"
    keep = {tr.name for tr in objs.triggers}
    keep_functions = ", ".join(lit(f.name) for f in objs.functions)
    fn_prefix = f"{n.tag}_"
    cover = next(f for f in objs.functions if f.returns == "void")
    body = (
        "\nDECLARE\n"
        "  old pg_catalog.name;\n"
        "BEGIN\n"
        + _drop_foreign_generations(n, keep, root, "  ")
        + _ensure_triggers(list(objs.triggers), root, "  ")
        + f"  PERFORM {cover.sql_name}();\n"
        "  FOR old IN SELECT p.proname FROM pg_catalog.pg_proc p\n"
        "              WHERE p.pronamespace = 'fencekit'::pg_catalog.regnamespace\n"
        "                AND p.pronargs = 0\n"
        f"                AND pg_catalog.left(p.proname::pg_catalog.text, {len(fn_prefix)})\n"
        f"                    OPERATOR(pg_catalog.=) {lit(fn_prefix)}\n"
        "                AND p.proname::pg_catalog.text OPERATOR(pg_catalog.<>) ALL\n"
        f"                    (ARRAY[{keep_functions}]) LOOP\n"
        "    EXECUTE pg_catalog.format('DROP FUNCTION fencekit.%I()', old);\n"
        "  END LOOP;\n"
        "END\n"
    )
    return do(body)


def protect_statements(spec: FenceSpec) -> list[str]:
    """Statements that protect a table, without transaction control; idempotent."""
    objs = table_objects(spec)
    n = names_for(spec)
    t = spec.table
    out: list[str] = [_guard(spec)]
    if spec.scope is Scope.ROW:
        # Nullable, and a default only new rows use: catalog-only changes, no table rewrite.
        out.append(add_column_quietly(spec))
        out.append(f"ALTER TABLE {t.sql} ALTER COLUMN {n.col} SET DEFAULT {FENCE_DEFAULT}")
        out.append(
            f"COMMENT ON COLUMN {t.sql}.{n.col} IS "
            + lit("fencekit: the fence of this row (highest token accepted); managed by fencekit")
        )
    if spec.scope is Scope.KEY:
        keys = ", ".join(lit(k) for k in spec.key)
        out.append(
            f"SELECT fencekit.check_key_columns({lit(t.sql)}::pg_catalog.regclass, "
            f"ARRAY[{keys}], {n.resource})"
        )
    if spec.resource is not None or spec.issuer is not None:
        issuer = lit(spec.issuer) if spec.issuer else "NULL"
        out.append(f"SELECT fencekit.bind_resource({n.resource}, {issuer})")
    out.append(create_counters_quietly(n.tag))
    for f in objs.functions:
        out += _create_function_sql(f)
    out.append(_triggers_sql(objs, n))
    spec_json = json.dumps(spec.as_dict(), sort_keys=True, ensure_ascii=False)
    resource = n.resource if spec.scope is not Scope.ROW else "NULL"
    families = "NULL"
    if spec.scope is Scope.KEY:
        keys = ", ".join(lit(k) for k in spec.key)
        families = f"fencekit.key_families({lit(t.sql)}::pg_catalog.regclass, ARRAY[{keys}])"
    out.append(
        "INSERT INTO fencekit.protected AS p "
        "(schema_name, table_name, tag, scope, resource, spec, template_version, key_families)\n"
        f"VALUES ({lit(t.schema)}, {lit(t.name)}, {n.lit_tag}, "
        f"{lit(spec.scope.value)}, {resource}, {lit(spec_json)}, {TEMPLATE_VERSION},\n"
        f"        {families})\n"
        "ON CONFLICT (schema_name, table_name) DO UPDATE\n"
        "  SET tag = excluded.tag, scope = excluded.scope, resource = excluded.resource,\n"
        "      spec = excluded.spec, template_version = excluded.template_version,\n"
        "      key_families = excluded.key_families, protected_at = pg_catalog.now()\n"
        "  WHERE (p.spec, p.template_version, p.key_families)\n"
        "        IS DISTINCT FROM (excluded.spec, excluded.template_version, excluded.key_families)"
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
    out.append(
        f"DELETE FROM fencekit.protected WHERE schema_name = {lit(t.schema)} "
        f"AND table_name = {lit(t.name)}"
    )
    if spec.scope is not Scope.ROW:
        # A named resource shared with other tables keeps its fences.
        unused = f"NOT EXISTS (SELECT FROM fencekit.protected WHERE resource = {n.resource})"
        out.append(f"DELETE FROM fencekit.fences WHERE resource = {n.resource} AND {unused}")
        out.append(f"DELETE FROM fencekit.floors WHERE resource = {n.resource} AND {unused}")
    if spec.resource is not None or spec.issuer is not None:
        out.append(
            f"DELETE FROM fencekit.resources WHERE resource = {n.resource} "
            f"AND NOT EXISTS (SELECT FROM fencekit.protected WHERE resource = {n.resource})"
        )
    return out


def drop_objects(tag: str, root: str) -> str:
    """A DO block dropping the ``fencekit_<tag>_*`` triggers on ``root`` (a SQL expression
    yielding a regclass or NULL) and its descendants, then the ``fencekit.<tag>_*`` functions."""
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
        f"                    AND pg_catalog.left(tg.tgname::pg_catalog.text, {len(prefix)})\n"
        f"                        OPERATOR(pg_catalog.=) {lit(prefix)} LOOP\n"
        "        EXECUTE pg_catalog.format('DROP TRIGGER %I ON %s', old, rel);\n"
        "      END LOOP;\n"
        "    END LOOP;\n"
        "  END IF;\n"
        "  FOR old IN SELECT p.proname FROM pg_catalog.pg_proc p\n"
        "              WHERE p.pronamespace = 'fencekit'::pg_catalog.regnamespace\n"
        "                AND p.pronargs = 0\n"
        f"                AND pg_catalog.left(p.proname::pg_catalog.text, {len(fn_prefix)})\n"
        f"                    OPERATOR(pg_catalog.=) {lit(fn_prefix)} LOOP\n"
        "    EXECUTE pg_catalog.format('DROP FUNCTION fencekit.%I()', old);\n"
        "  END LOOP;\n"
        "END\n"
    )


def add_column_quietly(spec: FenceSpec) -> str:
    """Add a row fence's column unless it exists: ``ADD COLUMN IF NOT EXISTS`` would print a
    NOTICE on every re-run, and a re-run of a protect script is meant to be quiet."""
    t = spec.table
    add = f"ALTER TABLE {t.sql} ADD COLUMN {names_for(spec).col} bigint"
    return do(
        "\nBEGIN\n"
        "  IF NOT EXISTS (SELECT FROM pg_catalog.pg_attribute a\n"
        f"                 WHERE a.attrelid = {lit(t.sql)}::pg_catalog.regclass\n"
        f"                   AND a.attname OPERATOR(pg_catalog.=) {lit(spec.column)}\n"
        "                   AND a.attnum > 0 AND NOT a.attisdropped) THEN\n"
        f"    EXECUTE {lit(add)};\n"
        "  END IF;\nEND\n"
    )


def create_counters_quietly(tag: str) -> str:
    """``fencekit.create_counters(tag)`` only while one of its sequences is missing: it uses
    ``CREATE SEQUENCE IF NOT EXISTS``, which prints a NOTICE per existing sequence."""
    return (
        f"SELECT fencekit.create_counters({lit(tag)})\n"
        " WHERE EXISTS (SELECT FROM pg_catalog.unnest(fencekit.counter_names()) r\n"
        "                WHERE pg_catalog.to_regclass(pg_catalog.format('fencekit.%I',\n"
        f"                        {lit(tag + ':')} OPERATOR(pg_catalog.||) r)) IS NULL)"
    )


_SHELL_SAFE = "'^[A-Za-z0-9_@%+=:,./-]+$'"


def _sh(expr: str) -> str:
    """SQL: the text ``expr`` quoted for a POSIX shell, as :func:`shlex.quote` quotes it."""
    return (
        f"CASE WHEN {expr} OPERATOR(pg_catalog.~) {_SHELL_SAFE} THEN {expr}\n"
        f"        ELSE '''' OPERATOR(pg_catalog.||) pg_catalog.replace({expr}, '''', "
        "'''\"''\"''') OPERATOR(pg_catalog.||) '''' END"
    )


def shell_args_sql(spec_expr: str, table_expr: str) -> str:
    """SQL: the command-line arguments that reproduce the spec ``spec_expr`` (jsonb) for the
    table ``table_expr`` (text, as SQL writes it), shell-quoted: what ``FenceSpec.cli_args``
    prints for the same spec (a test compares them)."""
    s = spec_expr
    cat = "OPERATOR(pg_catalog.||)"
    eq = "OPERATOR(pg_catalog.=)"
    ne = "OPERATOR(pg_catalog.<>)"
    resource = f"({s} ->> 'resource')"
    column = f"({s} ->> 'column')"
    issuer = f"({s} ->> 'issuer')"
    return (
        f"pg_catalog.concat_ws(' ', {_sh(table_expr)},\n"
        f"      CASE WHEN {s} ->> 'scope' {eq} 'table' THEN '--scope table' END,\n"
        f"      (SELECT pg_catalog.string_agg('--key ' {cat} {_sh('k')}, ' ' ORDER BY o)\n"
        f"         FROM pg_catalog.jsonb_array_elements_text({s} -> 'key')"
        " WITH ORDINALITY AS e(k, o)),\n"
        f"      '--resource ' {cat} {_sh(resource)},\n"
        f"      CASE WHEN {s} ->> 'on_missing' {ne} 'reject'\n"
        f"           THEN '--on-missing ' {cat} ({s} ->> 'on_missing') END,\n"
        f"      CASE WHEN {s} ->> 'on_equal' {ne} 'accept'\n"
        f"           THEN '--on-equal ' {cat} ({s} ->> 'on_equal') END,\n"
        f"      CASE WHEN {s} ->> 'scope' {eq} 'row' AND {column} {ne} {lit(DEFAULT_COLUMN)}\n"
        f"           THEN '--column ' {cat} {_sh(column)} END,\n"
        f"      '--issuer ' {cat} {_sh(issuer)})"
    )


def unprotect_guard(spec: FenceSpec) -> str:
    """A DO block refusing (YF000) unless the registry holds exactly ``spec`` for the table,
    with a hint naming the command that generates the right script. For a table the registry
    does not know it says so (a NOTICE): the script then only cleans leftovers."""
    t = spec.table
    wanted = json.dumps(spec.as_dict(), sort_keys=True, ensure_ascii=False)
    # Registry rows written before an option existed take its default.
    base = json.dumps(FenceSpec(t).as_dict(), sort_keys=True, ensure_ascii=False)
    cli = shell_args_sql("have", "tbl")
    return do(
        "\nDECLARE\n"
        "  have pg_catalog.jsonb;\n"
        f"  tbl pg_catalog.text := {lit(t.sql)};\n"
        "BEGIN\n"
        f"  SELECT {lit(base)}::pg_catalog.jsonb OPERATOR(pg_catalog.||) p.spec INTO have\n"
        "    FROM fencekit.protected p\n"
        f"   WHERE p.schema_name OPERATOR(pg_catalog.=) {lit(t.schema)}\n"
        f"     AND p.table_name OPERATOR(pg_catalog.=) {lit(t.name)};\n"
        "  IF NOT FOUND THEN\n"
        "    RAISE NOTICE 'fencekit: % is not in fencekit.protected; removing leftover fencekit '\n"
        "                 'objects only', tbl;\n"
        f"  ELSIF have IS DISTINCT FROM {lit(wanted)}::pg_catalog.jsonb THEN\n"
        "    RAISE EXCEPTION USING ERRCODE = 'YF000',\n"
        "      MESSAGE = pg_catalog.format('fencekit: this script unprotects %s with spec %s, '\n"
        "        'but fencekit.protected holds %s; nothing was changed', tbl,\n"
        f"        {lit(wanted)}, have::pg_catalog.text),\n"
        "      HINT = 'Generate the script for what is there: fencekit sql unprotect '\n"
        f"        OPERATOR(pg_catalog.||) {cli}\n"
        "        OPERATOR(pg_catalog.||) ' (or run fencekit unprotect TABLE --dsn DSN, which '\n"
        "        'reads the spec from the registry)';\n"
        "  END IF;\nEND\n"
    )
