"""The core schema (``fencekit`` schema, tables, shared functions): install and uninstall.

The SQL lives in ``fencekit/sqlsrc/core/*.sql``, run in name order; every statement there is
idempotent, so re-running the install over an older one upgrades it in place.
"""

from __future__ import annotations

from importlib import resources

from fencekit.sqlgen.text import do, lit

__all__ = ["CORE_VERSION", "install_statements", "uninstall_statements"]

#: Version of the core schema (``fencekit`` schema, tables, shared functions).
CORE_VERSION = 3


def _core_files() -> list[tuple[str, str]]:
    root = resources.files("fencekit") / "sqlsrc" / "core"
    files = sorted((p for p in root.iterdir() if p.name.endswith(".sql")), key=lambda p: p.name)
    return [(p.name, p.read_text(encoding="utf-8")) for p in files]


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


def uninstall_statements() -> list[str]:
    """Remove the core schema, without transaction control. Refuses while tables are protected.

    The roles ``fencekit_admin`` and ``fencekit_writer`` stay: roles belong to the whole server,
    and other databases may use them.
    """
    return [
        do(
            "\nBEGIN\n"
            "  IF pg_catalog.to_regclass('fencekit.protected') IS NOT NULL\n"
            "     AND EXISTS (SELECT FROM fencekit.protected) THEN\n"
            "    RAISE EXCEPTION USING ERRCODE = 'YF000',\n"
            "      MESSAGE = 'fencekit: tables are still protected; unprotect them first',\n"
            "      HINT = 'SELECT schema_name, table_name FROM fencekit.protected; then fencekit "
            "unprotect each.';\n"
            "  END IF;\nEND\n"
        ),
        "DROP SCHEMA IF EXISTS fencekit CASCADE",
    ]
