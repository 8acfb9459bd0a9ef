"""Move a protected table from one fence spec to another in one transaction.

Policies (on_missing, on_equal, lease binding, issuer) change in place: re-running protect
replaces the function bodies and the registry row and keeps every fence. A change of scope,
key columns, resource or fence column is a *move*: the table's old triggers and functions go,
the fences are carried over to the new spec, and the new objects are created, all in the
caller's transaction while a lock keeps every writer of the table (and of the tables sharing
either resource) out. Nothing is ever unprotected in between: a writer either waits for the
move and then meets the new triggers, or gives up on its own lock_timeout.

The carry is conservative: no row or key may end up with a fence lower than a token the old
spec accepted for it.

- row -> key: a key's fence is the highest row fence among the rows with that key (the key
  text computed exactly as the key triggers compute it, under the same pinned settings).
- row -> table, key -> table: the table fence is the highest fence of the old rows or keys.
- key -> row, table -> row: each row's fence is its key's fence, or the table fence.
- table -> key: every key that has rows gets the table fence, and the resource gets a *floor*
  (``fencekit.floors``): a key without a fence starts there, so a stale writer cannot create a
  new key below the old table fence.
- key -> key with the same key columns (another resource): the old resource's fences are
  copied. With other key columns a new key takes the highest fence of the old keys of its rows,
  and of every old key that has no rows any more (nobody can tell which new key such a key
  would become); unseen keys start at the highest old fence (a floor).
- fence column renamed: the column is renamed, values and all.

Where the new resource already has fences (shared with other tables), the higher fence stays.
The old resource's fences are removed when no other table uses it, as unprotect does.
"""

from __future__ import annotations

from fencekit.errors import SpecError
from fencekit.ident import quote_ident
from fencekit.spec import FenceSpec, Scope
from fencekit.sqlgen.common import lit_lines, names_for, spec_jsonb
from fencekit.sqlgen.key import KEY_SETTINGS, key_expression
from fencekit.sqlgen.protect import add_column_quietly, drop_objects, protect_statements
from fencekit.sqlgen.text import do, lit

__all__ = ["STRUCTURE", "is_move", "move_statements"]

#: The parts of a spec that decide which objects, columns and fences a table has; a change of
#: any of them is a move. Every other option is a policy and changes by re-running protect.
STRUCTURE = ("scope", "key", "resource", "column")


def is_move(old: FenceSpec, new: FenceSpec) -> bool:
    """True when going from ``old`` to ``new`` changes the structure (see :data:`STRUCTURE`),
    not only the policies."""
    a, b = old.as_dict(), new.as_dict()
    return any(a[k] != b[k] for k in STRUCTURE)


def _registered(t_schema: str, t_name: str, indent: str = "") -> str:
    """SQL: ``p`` (a fencekit.protected row) is the table's; ``indent``: break the line."""
    sep = f"\n{' ' * 22}{indent}" if indent else " "
    return (
        f"p.schema_name OPERATOR(pg_catalog.=) {lit(t_schema)}{sep}"
        f"AND p.table_name OPERATOR(pg_catalog.=) {lit(t_name)}"
    )


def _lock(old: FenceSpec, new: FenceSpec) -> list[str]:
    """Keep every writer out until commit: the table (and its descendants), and every other
    table sharing the old or the new resource (their writes advance the same fences). SHARE
    ROW EXCLUSIVE lets readers through and conflicts with every write lock; the DDL that
    follows takes ACCESS EXCLUSIVE for the rest of the transaction."""
    t = old.table
    out = [f"LOCK TABLE {t.sql} IN SHARE ROW EXCLUSIVE MODE"]
    shared = {s.resource_name for s in (old, new) if s.scope is not Scope.ROW}
    if shared:
        resources = ", ".join(lit(r) for r in sorted(shared))
        out.append(
            do(
                "\nDECLARE\n  rel pg_catalog.regclass;\nBEGIN\n"
                "  -- In name order, so that two moves never wait for each other in a cycle.\n"
                "  FOR rel IN SELECT pg_catalog.to_regclass(pg_catalog.format('%I.%I', "
                "p.schema_name, p.table_name))\n"
                "               FROM fencekit.protected p\n"
                f"              WHERE p.resource OPERATOR(pg_catalog.=) ANY (ARRAY[{resources}])\n"
                f"                AND NOT ({_registered(t.schema, t.name)})\n"
                "              ORDER BY p.schema_name, p.table_name LOOP\n"
                "    CONTINUE WHEN rel IS NULL;\n"
                "    EXECUTE pg_catalog.format('LOCK TABLE %s IN SHARE ROW EXCLUSIVE MODE', rel);\n"
                "  END LOOP;\nEND\n"
            )
        )
    return out


def _guard(old: FenceSpec, new: FenceSpec) -> str:
    """Refuse (YF000) unless the registry holds exactly ``old`` for the table
    (``fencekit.move_guard``, 48_guards.sql): a script generated for another spec would carry
    the wrong fences; nor a carry from a fence or key column swapped since protect."""
    t = old.table
    return do(
        "\nDECLARE\n"
        f"  tbl pg_catalog.text := {lit(t.sql)};\n"
        "BEGIN\n"
        f"  PERFORM fencekit.move_guard(tbl,\n    {spec_jsonb(old, '    ')},\n"
        f"    {spec_jsonb(new, '    ')});\n"
        # The name must still be the protected table, not a view (whose functions would run as
        # the mover) or another relation the owner put under it after renaming the table.
        "  PERFORM fencekit.registered_table(tbl::pg_catalog.regclass);\n"
        # Before anything reads, writes or drops: only in the owner's session (_owner_only).
        + (_owner_only(new) + "\n" if is_move(old, new) and _reads_rows(old, new) else "")
        + _column_types(old, new)
        + _column_free(old, new)
        + _columns_bound(old, new)
        + "END\n"
    )


def _column_types(old: FenceSpec, new: FenceSpec) -> str:
    """The carry computes key texts and compares fences as the mover (a DBA, an admin): only
    of columns whose types are built in. The old key's columns must still have the types
    protect recorded (``fencekit.check_key_types``: the owner may have retyped one to a type
    of its own, whose cast to text is its code); the old fence column and the new key's
    columns must be built in (``fencekit.builtin_type``; the protect that follows the carry
    checks the rest)."""
    out = ""
    if old.scope is Scope.KEY:
        out += (
            f"  PERFORM fencekit.check_key_types({lit(names_for(old).tag)}, "
            "tbl::pg_catalog.regclass);\n"
        )
    cols = [old.column] if old.scope is Scope.ROW else []
    cols += list(new.key) if new.scope is Scope.KEY else []
    out += "".join(
        f"  PERFORM fencekit.builtin_type(tbl::pg_catalog.regclass, {lit(c)});\n" for c in cols
    )
    return out


def _columns_bound(old: FenceSpec, new: FenceSpec) -> str:
    """A carry that reads the old fence or key column from the rows must read the column
    protect bound, not another the owner added under its name (fencekit.check_bound_columns);
    nor may a move that keeps the key columns (fences copied by key) bind the new protection to
    such a column: it deletes the registry row that records the bound one first."""
    if old.scope is Scope.TABLE or not is_move(old, new):
        return ""
    if not _reads_rows(old, new) and new.scope is Scope.TABLE:
        return ""  # a table fence binds no column
    return "  PERFORM fencekit.check_bound_columns(tbl::pg_catalog.regclass);\n"


def _column_free(old: FenceSpec, new: FenceSpec) -> str:
    """A move to a row fence fills the fence column: refuse one that holds the table's data."""
    if new.scope is not Scope.ROW or old.scope is Scope.ROW:
        return ""
    t = new.table
    message = f"fencekit: {t.sql} already has a column {new.column}; nothing was moved"
    return (
        "  IF EXISTS (SELECT FROM pg_catalog.pg_attribute a\n"
        f"             WHERE a.attrelid = {lit(t.sql)}::pg_catalog.regclass\n"
        f"               AND a.attname OPERATOR(pg_catalog.=) {lit(new.column)}\n"
        "               AND a.attnum > 0 AND NOT a.attisdropped) THEN\n"
        "    RAISE EXCEPTION USING ERRCODE = 'YF000',\n"
        f"      MESSAGE = {lit(message)},\n"
        "      HINT = 'The move fills the fence column; name a new one (--column NAME).';\n"
        "  END IF;\n"
    )


def _unbind(spec: FenceSpec, resource: str) -> str:
    """Forget ``resource``'s issuer binding unless another table uses it, so that protect
    binds it again with the new issuer (a shared resource keeps its binding: protect then
    refuses another issuer, whose tokens would not be comparable)."""
    t = spec.table
    return (
        f"DELETE FROM fencekit.resources r WHERE r.resource = {lit(resource)}\n"
        "   AND NOT EXISTS (SELECT FROM fencekit.protected p\n"
        f"                    WHERE p.resource = {lit(resource)}\n"
        f"                      AND NOT ({_registered(t.schema, t.name, '  ')}))"
    )


def _reads_rows(old: FenceSpec, new: FenceSpec) -> bool:
    """True when the carry reads or writes the table's rows: from or to a row fence (but table
    -> row, which adds the column with a constant default), or to a key fence whose keys come
    from the rows (from a table fence, or from a key fence with other key columns)."""
    if old.scope is Scope.ROW:
        return True
    if new.scope is Scope.ROW:
        return old.scope is Scope.KEY
    if new.scope is Scope.KEY:
        return old.scope is Scope.TABLE or old.key != new.key
    return False


def _owner_only(new: FenceSpec) -> str:
    """Refuse (42501) unless this session logged in as the table's owner
    (``fencekit.session_is``): reading the table runs its owner's code (the planner folds index,
    statistics and partition key expressions; a write runs triggers, rules, constraints,
    policies), and SET ROLE cannot contain it (it can RESET ROLE back to the mover, a superuser
    or an admin). Checked before the first read; the whole move rolls back, nothing changed."""
    t = new.table
    message = (
        "fencekit: refusing to move %s in a session of %I: the move reads (to a row fence, "
        "also writes) the table's rows, which runs its owner's code (index and statistics "
        "expressions while the read is planned; triggers, rules, constraints, policies on a "
        "write), and fencekit runs that code only in a session logged in as the owner %s (SET "
        "ROLE cannot contain it); nothing was changed"
    )
    hint = (
        "Log in as %s (owning the table's generated fencekit functions and counters, granted "
        "fencekit_admin and CREATE on schema fencekit for this move only: revoke both after, "
        "an admin member is not kept from fencekit's state) and run the same move: fencekit "
        "move ... --dsn <a DSN that logs in as %s>. Or move through a table fence (--scope "
        "table, then the new options), which reads no row when it starts from a key or table "
        "fence."
    )
    owner = (
        "(SELECT c.relowner FROM pg_catalog.pg_class c\n"
        f"           WHERE c.oid = {lit(t.sql)}::pg_catalog.regclass)"
    )
    return (
        f"  IF NOT fencekit.session_is({owner}) THEN\n"
        "    RAISE EXCEPTION USING ERRCODE = '42501',\n"
        f"      MESSAGE = pg_catalog.format(\n        {lit_lines(message, ' ' * 8)},\n"
        f"        {lit(t.sql)}, fencekit.session_role(),\n"
        f"        {owner}::pg_catalog.regrole),\n"
        f"      HINT = pg_catalog.format(\n        {lit_lines(hint, ' ' * 8)},\n"
        f"        {owner}::pg_catalog.regrole,\n"
        f"        {owner}::pg_catalog.regrole);\n"
        "  END IF;"
    )


#: What the carry runs under: the key triggers' settings (a key's text must be the one they
#: compute), pg_catalog's operators and functions only, and no row-level security (a policy
#: that would apply to the mover makes the move fail instead of running the policy's code).
_CARRY_SETTINGS: tuple[tuple[str, str], ...] = (
    *KEY_SETTINGS,
    ("search_path", "'pg_catalog, pg_temp'"),
    ("row_security", "'off'"),
)


def _text(value: str) -> str:
    """A setting's value as :data:`KEY_SETTINGS` writes it (SQL after ``SET x TO``), as a
    text literal for set_config."""
    return value if value.startswith("'") else lit(value)


def _carry(old: FenceSpec, new: FenceSpec) -> str:
    """The DO block that carries the fences from ``old`` to ``new`` (see the module docstring).

    It runs after the old objects and the registry row are gone and before the new ones are
    made, under the settings the key triggers pin (a key's text must be the one they compute);
    it restores the caller's settings at the end.
    """
    t = old.table
    src, dst = lit(old.resource_name), lit(new.resource_name)
    carry = quote_ident(f"fencekit_move_{names_for(old).tag}")
    fences = "fencekit.fences"
    ok, nk = old.scope is Scope.KEY, new.scope is Scope.KEY
    old_key = key_expression(old.key, "r") if ok else ""
    new_key = key_expression(new.key, "r") if nk else ""
    declare = ["  old_floor pg_catalog.int8;", "  new_floor pg_catalog.int8;"]
    declare += ["  top pg_catalog.int8;", "  orphan pg_catalog.int8;"]
    declare += [
        f"  saved_{i} pg_catalog.text := pg_catalog.current_setting({lit(name)});"
        for i, (name, _) in enumerate(_CARRY_SETTINGS)
    ]
    body: list[str] = [
        f"  PERFORM pg_catalog.set_config({lit(name)}, {_text(value)}, true);"
        for name, value in _CARRY_SETTINGS
    ]
    if old.scope is not Scope.ROW:
        body.append(
            f"  SELECT fl.floor INTO old_floor FROM fencekit.floors fl WHERE fl.resource = {src};"
        )
    if new.scope is not Scope.ROW:
        body.append(
            f"  CREATE TEMPORARY TABLE {carry} (key pg_catalog.text PRIMARY KEY,\n"
            "    fence pg_catalog.int8 NOT NULL);"
        )
    # What the old spec accepted for one row r (NULL: nothing).
    if old.scope is Scope.ROW:
        row_fence = f"r.{quote_ident(old.column)}"
    elif ok:
        row_fence = (
            f"COALESCE((SELECT f.fence FROM {fences} f WHERE f.resource = {src}\n"
            f"                     AND f.key =\n                   {old_key}),\n"
            "                 old_floor)"
        )
    else:
        row_fence = "top"
    # The highest fence the old spec holds anywhere (NULL: none).
    if old.scope is Scope.ROW:
        highest = f"(SELECT pg_catalog.max(r.{quote_ident(old.column)}) FROM {t.sql} r)"
    else:
        highest = (
            f"GREATEST((SELECT pg_catalog.max(f.fence) FROM {fences} f\n"
            f"                      WHERE f.resource = {src}), old_floor)"
        )
    if old.scope is Scope.TABLE:
        body.append(
            f"  top := GREATEST((SELECT f.fence FROM {fences} f WHERE f.resource = {src}\n"
            "                     AND f.key = ''), old_floor);"
        )
    if new.scope is Scope.ROW and old.scope is Scope.TABLE:
        # Every row takes the table fence: the column is added with it as a constant default
        # (a catalog change, no rewrite: no UPDATE, so none of the owner's code runs, whoever
        # moves), then the default goes (protect sets the fence column's own).
        col = quote_ident(new.column)
        add = f"ALTER TABLE {t.sql} ADD COLUMN {col} pg_catalog.int8"
        body.append(
            "  IF top IS NULL THEN\n"
            f"    {add};\n"
            "  ELSE\n"
            "    -- dynamic SQL: the carried table fence, a bigint, is known only at run time\n"
            f"    EXECUTE {lit(add + ' DEFAULT ')}\n"
            "      OPERATOR(pg_catalog.||) top::pg_catalog.text;\n"
            f"    ALTER TABLE {t.sql} ALTER COLUMN {col} DROP DEFAULT;\n"
            "  END IF;"
        )
    elif new.scope is Scope.ROW:
        # Each row takes its key's fence: filling the column writes the table, which runs its
        # owner's code (triggers, rules, constraints, index expressions, policies): only in a
        # session logged in as the owner (checked first, by _guard), never with the bypass
        # on. No UPDATE at all when there is nothing to carry: even one that matches no row
        # fires statement triggers and rules.
        col = quote_ident(new.column)
        body.append(
            f"  IF (EXISTS (SELECT FROM {fences} f WHERE f.resource = {src})"
            f" OR old_floor IS NOT NULL)\n     AND EXISTS (SELECT FROM {t.sql}) THEN\n"
            "    PERFORM pg_catalog.set_config('fencekit.bypass', '', true);\n"
            f"    UPDATE {t.sql} AS r SET {col} = f.fence FROM {fences} f\n"
            f"     WHERE f.resource = {src}\n       AND f.key = {old_key};\n"
            "    IF old_floor IS NOT NULL THEN\n"
            f"      UPDATE {t.sql} AS r SET {col} = old_floor WHERE r.{col} IS NULL;\n"
            "    END IF;\n"
            "  END IF;"
        )
    elif new.scope is Scope.TABLE:
        body.append(
            f"  top := {highest};\n"
            f"  IF top IS NOT NULL THEN\n    INSERT INTO {carry} VALUES ('', top);\n  END IF;"
        )
    elif old.scope is Scope.ROW:
        body.append(
            f"  INSERT INTO {carry}\n"
            f"  SELECT {new_key},\n         pg_catalog.max({row_fence})\n    FROM {t.sql} r\n"
            f"   WHERE {row_fence} IS NOT NULL GROUP BY 1;"
        )
    elif old.scope is Scope.TABLE:
        body.append(
            "  new_floor := top;\n"
            f"  INSERT INTO {carry}\n  SELECT DISTINCT {new_key}, top\n    FROM {t.sql} r"
            " WHERE top IS NOT NULL;"
        )
    elif old.key == new.key:
        body.append(
            f"  INSERT INTO {carry} SELECT f.key, f.fence FROM {fences} f\n"
            f"   WHERE f.resource = {src};\n"
            "  new_floor := old_floor;"
        )
    else:
        body.append(
            # Old keys without rows: which new key each would become is unknown, so every
            # new key takes the highest of them.
            f"  SELECT pg_catalog.max(f.fence) INTO orphan FROM {fences} f\n"
            f"   WHERE f.resource = {src}\n"
            f"     AND NOT EXISTS (SELECT FROM {t.sql} r\n"
            f"                      WHERE {old_key} = f.key);\n"
            f"  INSERT INTO {carry}\n"
            f"  SELECT {new_key},\n         GREATEST(pg_catalog.max({row_fence}), orphan)\n"
            f"    FROM {t.sql} r GROUP BY 1\n"
            f"  HAVING GREATEST(pg_catalog.max({row_fence}), orphan) IS NOT NULL;\n"
            f"  new_floor := {highest};"
        )
    if old.scope is not Scope.ROW:
        # As unprotect does: the old resource's fences go unless another table uses it.
        body.append(
            f"  IF NOT EXISTS (SELECT FROM fencekit.protected p WHERE p.resource = {src}) THEN\n"
            f"    DELETE FROM {fences} WHERE resource = {src};\n"
            f"    DELETE FROM fencekit.floors WHERE resource = {src};\n"
            f"    DELETE FROM fencekit.resources WHERE resource = {src};\n"
            "  END IF;"
        )
    if new.scope is not Scope.ROW:
        body.append(
            f"  INSERT INTO {fences} AS f (resource, key, fence)\n"
            f"  SELECT {dst}, c.key, c.fence FROM {carry} c\n"
            "  ON CONFLICT (resource, key) DO UPDATE\n"
            "     SET fence = excluded.fence, updated_at = pg_catalog.now()\n"
            "   WHERE f.fence < excluded.fence;\n"
            "  IF new_floor IS NOT NULL THEN\n"
            "    INSERT INTO fencekit.floors AS fl (resource, floor, reason)\n"
            f"    VALUES ({dst}, new_floor, {lit(f'fencekit move of {t.sql}')})\n"
            "    ON CONFLICT (resource) DO UPDATE\n"
            "       SET floor = excluded.floor, set_at = pg_catalog.now(),\n"
            "           reason = excluded.reason\n"
            "     WHERE fl.floor < excluded.floor;\n"
            "  END IF;\n"
            f"  DROP TABLE {carry};"
        )
    body += [
        f"  PERFORM pg_catalog.set_config({lit(name)}, saved_{i}, true);"
        for i, (name, _) in enumerate(_CARRY_SETTINGS)
    ]
    return do("\nDECLARE\n" + "\n".join(declare) + "\nBEGIN\n" + "\n".join(body) + "\nEND\n")


def move_statements(old: FenceSpec, new: FenceSpec) -> list[str]:
    """Statements that move ``old.table`` from spec ``old`` to spec ``new``, without
    transaction control (the caller's transaction holds the locks until it commits).
    Callers go through :func:`fencekit.sqlgen.change_statements`, the one fence-change model.

    With only policies changed this is protect's in-place re-run behind the same lock and
    guard. The script refuses to run (YF000) unless the registry holds exactly ``old``.
    """
    if old.table != new.table:
        raise SpecError(
            f"a move keeps the table ({old.table} -> {new.table}): rename it with fencekit rename"
        )
    t = old.table
    out = [*_lock(old, new), _guard(old, new)]
    if old.scope is not Scope.ROW and (old.issuer != new.issuer or is_move(old, new)):
        out.append(_unbind(old, old.resource_name))
    if not is_move(old, new):
        return out + protect_statements(new)
    out.append(drop_objects(names_for(old).tag, f"{lit(t.sql)}::pg_catalog.regclass"))
    out.append(f"DELETE FROM fencekit.protected p\n WHERE {_registered(t.schema, t.name)}")
    row_to_row = old.scope is Scope.ROW and new.scope is Scope.ROW
    if row_to_row:
        out.append(
            f"ALTER TABLE {t.sql} RENAME COLUMN {quote_ident(old.column)} "
            f"TO {quote_ident(new.column)}"
        )
    else:
        if new.scope is Scope.ROW and old.scope is Scope.KEY:
            out.append(add_column_quietly(new))  # table -> row: the carry adds it, filled
        out.append(_carry(old, new))
    out += protect_statements(new)
    if old.scope is Scope.ROW and new.scope is not Scope.ROW:
        # Only now: the carry read it.
        out.append(f"ALTER TABLE {t.sql} DROP COLUMN {quote_ident(old.column)}")
    return out
