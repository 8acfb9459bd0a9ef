"""The core schema (``fencekit`` schema, tables, shared functions): install and uninstall.

The SQL lives in ``fencekit/sqlsrc/core/*.sql``, run in name order; every statement there is
idempotent, so re-running the install over an older one upgrades it in place.
"""

from __future__ import annotations

from importlib import resources

from fencekit.sqlgen.text import do, lit

__all__ = ["CORE_VERSION", "core_guard", "install_statements", "uninstall_statements"]

#: Version of the core schema (``fencekit`` schema, tables, shared functions).
CORE_VERSION = 1


def _core_files() -> list[tuple[str, str]]:
    root = resources.files("fencekit") / "sqlsrc" / "core"
    files = sorted((p for p in root.iterdir() if p.name.endswith(".sql")), key=lambda p: p.name)
    return [(p.name, p.read_text(encoding="utf-8")) for p in files]


def core_guard() -> str:
    """The install's first step, also run by fencekit's commands before they read schema
    fencekit: refuses (YF000) while anything in it is another role's or runs another role's
    code. Reads catalogs only (00_guard.sql)."""
    return dict(_core_files())["00_guard.sql"]


def install_statements() -> list[str]:
    """The core install as a list of SQL chunks, without transaction control.

    Each chunk may hold several statements (it is run as one simple query).
    """
    chunks = [f"-- {name}\n{text.strip()}\n" for name, text in _core_files()]
    chunks.append(
        "INSERT INTO fencekit.meta (key, value) VALUES ('core_version', "
        f"{lit(str(CORE_VERSION))})\n"
        "ON CONFLICT (key) DO UPDATE SET value = excluded.value;\n"
        # Who installed: status reports fencekit objects owned by anyone else (a restore by an
        # application role leaves it owning them, and an owner can lower fences).
        "INSERT INTO fencekit.meta (key, value) VALUES ('owner', current_user)\n"
        "ON CONFLICT (key) DO UPDATE SET value = excluded.value;\n"
    )
    return chunks


def uninstall_statements(*, unprotect_all: bool = False) -> list[str]:
    """Remove the core schema, without transaction control.

    Refuses (YF000) while tables are protected, unless ``unprotect_all``: then every table in
    the registry first loses its ``fencekit_<tag>_*`` triggers (on its descendants too) and a
    row fence its column, with the fences they hold. ``fencekit uninstall`` runs each table's
    exact unprotect instead; this generic loop is for the script printed without a database.
    The roles ``fencekit_admin`` and ``fencekit_writer`` stay: roles belong to the whole
    server, and other databases may use them. Refuses (YF000) a schema fencekit in which another
    role made something, as the install does (:func:`core_guard`).
    """
    if unprotect_all:
        first = do(
            "\nDECLARE\n"
            "  p record;\n"
            "  rel pg_catalog.regclass;\n"
            "  old pg_catalog.name;\n"
            "BEGIN\n"
            "  IF pg_catalog.to_regclass('fencekit.protected') IS NULL THEN\n"
            "    RETURN;\n"
            "  END IF;\n"
            "  FOR p IN SELECT r.tag, r.scope, r.spec ->> 'column' AS col,\n"
            "                  pg_catalog.to_regclass(pg_catalog.format('%I.%I', r.schema_name,\n"
            "                                                           r.table_name)) AS root\n"
            "             FROM fencekit.protected r LOOP\n"
            "    CONTINUE WHEN p.root IS NULL;\n"
            "    FOR rel IN WITH RECURSIVE d(relid) AS (\n"
            "                 SELECT p.root::pg_catalog.oid\n"
            "                 UNION\n"
            "                 SELECT i.inhrelid FROM pg_catalog.pg_inherits i\n"
            "                   JOIN d ON i.inhparent = d.relid)\n"
            "               SELECT d.relid::pg_catalog.regclass FROM d LOOP\n"
            "      FOR old IN SELECT g.tgname FROM pg_catalog.pg_trigger g\n"
            "                  WHERE g.tgrelid = rel AND NOT g.tgisinternal AND g.tgparentid = 0\n"
            "                    AND pg_catalog.starts_with(g.tgname::pg_catalog.text,\n"
            "                                               'fencekit_' || p.tag || '_')\n"
            "      LOOP\n"
            "        EXECUTE pg_catalog.format('DROP TRIGGER %I ON %s', old, rel);\n"
            "      END LOOP;\n"
            "    END LOOP;\n"
            "    IF p.scope = 'row' THEN\n"
            "      EXECUTE pg_catalog.format('ALTER TABLE %s DROP COLUMN IF EXISTS %I', p.root,\n"
            "                                p.col);\n"
            "    END IF;\n"
            "  END LOOP;\n"
            "  DELETE FROM fencekit.protected;\n"
            "END\n"
        )
    else:
        first = do(
            "\nBEGIN\n"
            "  IF pg_catalog.to_regclass('fencekit.protected') IS NOT NULL\n"
            "     AND EXISTS (SELECT FROM fencekit.protected) THEN\n"
            "    RAISE EXCEPTION USING ERRCODE = 'YF000',\n"
            "      MESSAGE = 'fencekit: tables are still protected; nothing was removed',\n"
            "      HINT = 'fencekit uninstall --unprotect-all --dsn DSN unprotects them first '\n"
            "        '(their fences are lost); or unprotect each: SELECT schema_name, '\n"
            "        'table_name FROM fencekit.protected;';\n"
            "  END IF;\nEND\n"
        )
    # The guard first: reading a registry another role made would run its code.
    return [core_guard(), first, "DROP SCHEMA IF EXISTS fencekit CASCADE"]
