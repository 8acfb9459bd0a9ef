"""Follow a protected table through a rename (``ALTER TABLE ... RENAME``, ``op.rename_table``).

After a rename the table keeps its triggers and they keep firing (they are attached to the
table), but the registry row still names the old table, the tag (which names the triggers and
functions) is derived from the old name, and some generated bodies name the table. The rename
script moves the protection to the new name in one transaction, never leaving the table
unchecked: it drops the objects of the old tag and creates those of the new one (its tag is the
new name's), moves the registry row, the rejection counters and, for an unnamed key or table
fence, the fences of the default resource ``<schema>.<table>`` to the new one, keeping the
higher fence where both exist.
"""

from __future__ import annotations

from fencekit.spec import FenceSpec, Scope, TableName
from fencekit.sqlgen.common import names_for, spec_jsonb
from fencekit.sqlgen.protect import drop_objects, protect_statements
from fencekit.sqlgen.text import do, lit

__all__ = ["rename_statements"]


def _guard(old: FenceSpec, new: FenceSpec) -> str:
    """Refuse (YF000) unless the registry holds ``old`` exactly, the table under the new name
    exists and is the protected table (``fencekit.rename_guard``), and nothing is registered
    under it."""
    o, t = old.table, new.table
    return do(
        "\nBEGIN\n"
        f"  PERFORM fencekit.rename_guard({lit(o.sql)},\n    {spec_jsonb(old, '    ')},\n"
        f"    {lit(t.sql)});\n"
        f"  IF pg_catalog.to_regclass({lit(t.sql)}) IS NULL THEN\n"
        "    RAISE EXCEPTION USING ERRCODE = 'YF000',\n"
        f"      MESSAGE = {lit(f'fencekit: table {t.sql} does not exist; nothing was changed')},\n"
        f"      HINT = {lit(f'Rename the table first: ALTER TABLE {o.sql} RENAME TO ...')};\n"
        "  END IF;\n"
        "  IF EXISTS (SELECT FROM fencekit.protected p\n"
        f"             WHERE p.schema_name OPERATOR(pg_catalog.=) {lit(t.schema)}\n"
        f"               AND p.table_name OPERATOR(pg_catalog.=) {lit(t.name)}) THEN\n"
        "    RAISE EXCEPTION USING ERRCODE = 'YF000',\n"
        f"      MESSAGE = {lit(f'fencekit: {t.sql} is already in fencekit.protected')},\n"
        "      HINT = 'fencekit status shows both entries.';\n"
        "  END IF;\n"
        # Before the old triggers go: the DDL that follows must not run the owner's code here.
        f"  PERFORM fencekit.check_ddl_runs_no_owner_code({lit(t.sql)}::pg_catalog.regclass);\n"
        "END\n"
    )


def _move_counters(old_tag: str, new_tag: str) -> str:
    """Carry the rejection counters (sequences ``fencekit."<tag>:<reason>"``) to the new tag."""
    return do(
        "\nDECLARE\n"
        "  r pg_catalog.text;\n"
        "  v pg_catalog.int8;\n"
        "  called pg_catalog.bool;\n"
        "BEGIN\n"
        f"  PERFORM fencekit.create_counters({lit(new_tag)});\n"
        "  FOREACH r IN ARRAY fencekit.counter_names() LOOP\n"
        "    IF pg_catalog.to_regclass(pg_catalog.format('fencekit.%I',\n"
        f"         {lit(old_tag + ':')} OPERATOR(pg_catalog.||) r)) IS NOT NULL THEN\n"
        "      EXECUTE pg_catalog.format('SELECT last_value, is_called FROM fencekit.%I',\n"
        f"                                {lit(old_tag + ':')} OPERATOR(pg_catalog.||) r)\n"
        "        INTO v, called;\n"
        "      PERFORM pg_catalog.setval(pg_catalog.format('fencekit.%I',\n"
        f"                {lit(new_tag + ':')} OPERATOR(pg_catalog.||) r), v, called);\n"
        "    END IF;\n"
        "  END LOOP;\n"
        f"  PERFORM fencekit.drop_counters({lit(old_tag)});\n"
        "END\n"
    )


def _move_fences(old: FenceSpec, new: FenceSpec) -> list[str]:
    """An unnamed key or table fence's resource is the table's name: move its fences (and the
    issuer binding) to the new name. Where the new name already has a fence (left by an earlier
    table of that name), the higher one stays: no key may end up below a token it accepted."""
    if old.scope is Scope.ROW or old.resource is not None:
        return []
    src, dst = lit(old.resource_name), lit(new.resource_name)
    out = [
        "INSERT INTO fencekit.fences AS f (resource, key, fence, writer_xact, updated_at)\n"
        f"SELECT {dst}, o.key, o.fence, o.writer_xact, o.updated_at FROM fencekit.fences o\n"
        f" WHERE o.resource = {src}\n"
        "ON CONFLICT (resource, key) DO UPDATE\n"
        "  SET fence = GREATEST(f.fence, excluded.fence),\n"
        "      updated_at = GREATEST(f.updated_at, excluded.updated_at)",
        f"DELETE FROM fencekit.fences WHERE resource = {src}",
        # A floor (left by fencekit move) goes along: without it a new key would start below it.
        "INSERT INTO fencekit.floors AS fl (resource, floor, set_at, reason)\n"
        f"SELECT {dst}, o.floor, o.set_at, o.reason FROM fencekit.floors o\n"
        f" WHERE o.resource = {src}\n"
        "ON CONFLICT (resource) DO UPDATE SET floor = GREATEST(fl.floor, excluded.floor)",
        f"DELETE FROM fencekit.floors WHERE resource = {src}",
    ]
    if old.issuer is not None:
        out.append(f"DELETE FROM fencekit.resources WHERE resource = {src}")
    return out


def rename_statements(old: FenceSpec, new_table: TableName) -> list[str]:
    """Statements that move ``old``'s protection to ``new_table`` (the same table, renamed),
    without transaction control. The table stays checked throughout: its old triggers are
    dropped and the new ones created in the caller's transaction."""
    new = old.with_changes(table=new_table)
    on, nn = names_for(old), names_for(new)
    out = [_guard(old, new)]
    out.append(drop_objects(on.tag, f"{lit(new_table.sql)}::pg_catalog.regclass"))
    if on.tag != nn.tag:
        out.append(_move_counters(on.tag, nn.tag))
    out.append(
        f"DELETE FROM fencekit.protected WHERE schema_name = {lit(old.table.schema)} "
        f"AND table_name = {lit(old.table.name)}"
    )
    out += _move_fences(old, new)
    out += protect_statements(new)
    return out
