"""Refuse a migration whose connection would resolve names through a schema another role controls.

alembic's and SQLAlchemy's own catalog queries and version-table writes run under the migrating
role's search_path (``"$user", public`` by default). A role with CREATE on the database can make
a schema named after the migrating role, or write into ``public``, and plant there an operator
whose argument types match exactly (``=(name, varchar)``) or a pre-made version table with a
trigger: the migrating superuser or admin would run its code, and the migration commit it.
:func:`check_migration_path` refuses before any of that runs. It reads only the catalogs, with
the connection's path pinned (:func:`pinned_path`), so the check itself runs nothing of theirs.
"""

from __future__ import annotations

from typing import Any

from fencekit.catalog.session import pinned_path
from fencekit.errors import CatalogError

__all__ = ["check_migration_path"]

# Roles whose schemas and grants the migrating role may trust: itself, the roles it is a member
# of (it holds their rights anyway), and superusers.
_TRUSTED_ROLES = """
WITH RECURSIVE mine(oid) AS (
    SELECT r.oid FROM pg_catalog.pg_roles r
     WHERE r.rolname OPERATOR(pg_catalog.=) pg_catalog.current_user()::pg_catalog.name
    UNION
    SELECT m.roleid FROM pg_catalog.pg_auth_members m JOIN mine
        ON m.member OPERATOR(pg_catalog.=) mine.oid
)
SELECT mine.oid FROM mine
UNION SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolsuper
"""

# pg_database_owner (PostgreSQL 14+, owner of ``public``) stands for the database's owner.
_DB_OWNER = """
SELECT d.datdba,
       (SELECT r.oid FROM pg_catalog.pg_roles r
         WHERE r.rolname OPERATOR(pg_catalog.=) 'pg_database_owner'::pg_catalog.name)
  FROM pg_catalog.pg_database d
 WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()
"""

_SCHEMAS = """
SELECT n.nspname::pg_catalog.text, n.nspowner::pg_catalog.int8,
       pg_catalog.pg_get_userbyid(n.nspowner)::pg_catalog.text,
       ARRAY(SELECT a.grantee::pg_catalog.int8 FROM pg_catalog.aclexplode(n.nspacl) a
              WHERE a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'::pg_catalog.text)
  FROM pg_catalog.pg_namespace n
 WHERE n.nspname OPERATOR(pg_catalog.=) ANY (%s::pg_catalog.name[])
 ORDER BY 1
"""

_VERSION_TABLES = """
SELECT n.nspname::pg_catalog.text, c.relkind::pg_catalog.text, c.relowner::pg_catalog.int8,
       pg_catalog.pg_get_userbyid(c.relowner)::pg_catalog.text, c.relrowsecurity,
       EXISTS (SELECT FROM pg_catalog.pg_trigger t
                WHERE t.tgrelid OPERATOR(pg_catalog.=) c.oid AND NOT t.tgisinternal),
       EXISTS (SELECT FROM pg_catalog.pg_rewrite w
                WHERE w.ev_class OPERATOR(pg_catalog.=) c.oid)
  FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
 WHERE c.relname OPERATOR(pg_catalog.=) %s::pg_catalog.name
   AND n.nspname OPERATOR(pg_catalog.=) ANY (%s::pg_catalog.name[])
"""

_FIX = (
    "Nothing was run. Fix it before migrating: revoke CREATE on that schema from other roles, "
    "drop or rename a schema named after the migrating role, or give the migration a search_path "
    "of trusted schemas only (ALTER ROLE ... SET search_path, or SET search_path in env.py)"
)


def _role_name(conn: Any, oid: int) -> str:
    if oid == 0:
        return "PUBLIC"
    row = conn.execute(
        "SELECT pg_catalog.pg_get_userbyid(%s::pg_catalog.oid)::pg_catalog.text", (oid,)
    ).fetchone()
    return str(row[0])


def check_migration_path(
    conn: Any, *, version_table: str = "alembic_version", version_table_schema: str | None = None
) -> None:
    """Raise CatalogError unless every schema the connection resolves names through is trusted.

    Checked: each schema of ``current_schemas(true)``, a schema named after ``current_user`` or
    ``session_user`` (``"$user"``), and ``version_table_schema``. Trusted: owned by the migrating
    role, a role it is a member of, or a superuser, with CREATE held by no other role (PUBLIC
    included). The version table, where it exists in one of them, must be a plain table owned by
    such a role, with no triggers, rules or row security. ``conn`` has the
    ``execute(...).fetchone()`` face (a psycopg connection, or a wrapped DB-API one)."""
    # A pg_catalog function on a literal: nothing on the caller's path can stand in for it.
    row = conn.execute("SELECT pg_catalog.current_schemas(true)::pg_catalog.text[]").fetchone()
    names = list(row[0] or [])
    with pinned_path(conn):
        row = conn.execute(
            "SELECT pg_catalog.current_user()::pg_catalog.text,"
            " pg_catalog.session_user()::pg_catalog.text"
        ).fetchone()
        names += [str(row[0]), str(row[1])]
        if version_table_schema:
            names.append(version_table_schema)
        trusted = {int(r[0]) for r in conn.execute(_TRUSTED_ROLES).fetchall()}
        datdba, db_owner_role = conn.execute(_DB_OWNER).fetchone()

        def is_trusted(oid: int) -> bool:
            if db_owner_role is not None and oid == int(db_owner_role):
                oid = int(datdba)
            return oid != 0 and oid in trusted

        for schema, owner, owner_name, creators in conn.execute(_SCHEMAS, (names,)).fetchall():
            if not is_trusted(int(owner)):
                raise CatalogError(
                    f'the migration connection resolves names through schema "{schema}", owned '
                    f'by role "{owner_name}", which the migrating role does not trust: its '
                    f"operators, functions or tables there would run as the migrating role. {_FIX}"
                )
            for grantee in creators or []:
                if not is_trusted(int(grantee)):
                    raise CatalogError(
                        f'the migration connection resolves names through schema "{schema}", '
                        f'on which role "{_role_name(conn, int(grantee))}" has CREATE: what it '
                        f"creates there would run as the migrating role. {_FIX}"
                    )
        rows = conn.execute(_VERSION_TABLES, (version_table, names)).fetchall()
        for schema, kind, owner, owner_name, rls, triggers, rules in rows:
            why = None
            if not is_trusted(int(owner)):
                why = f'is owned by role "{owner_name}"'
            elif kind != "r" or triggers or rules or rls:
                why = "is not a plain table (it has triggers, rules or row security)"
            if why is not None:
                raise CatalogError(
                    f'the version table "{schema}"."{version_table}" {why}: the migration '
                    "writes it as the migrating role. Nothing was run; drop it after checking "
                    "its contents, and let the migrating role create it"
                )
