"""The planted database of the canary matrix, built once per test session (per worker) as a
template; each cell runs in a fresh copy of it, in fresh sessions.

Roles (cluster-wide, so suffixed per build): the table owner (neither superuser nor admin; it
owns schema ``app`` and everything planted in it), an application writer (DML and
fencekit_writer), and a member of fencekit_admin. The test session's superuser protects the
tables, as a DBA would.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from psycopg import sql

from fencekit.embedded import EmbeddedServer
from fencekit.spec import FenceSpec, Scope, TableName
from fencekit.sqlgen import protect_statements, render_install
from tests.security.canary import _plant
from tests.security.canary._plant import Table

FENCE = 10
FRESH = 20

#: Protected, every table planter: the tables every entry point is pointed at.
PROTECTED = [
    Table("t_row", "row"),
    Table("t_key", "key"),
    # Keys that print by the key settings (a date): the key triggers set them around the key
    # query, and set the writer's back, only for such keys.
    Table("t_dkey", "key", key=("k", "kd")),
    Table("t_table", "table"),
]
#: Protected partitioned tables (the partition-key planters).
PARTITIONED = [
    Table("p_row", "row", partitioned=True),
    Table("p_key", "key", partitioned=True),
    Table("p_table", "table", partitioned=True),
]
#: Planted but not protected: what protect and the migration operations' protect act on.
UNPROTECTED = [Table("u_row", "row"), Table("u_key", "key"), Table("u_table", "table")]
#: Protected, then renamed away by the owner with a view under the old name (view-swap).
SWAPPED = [Table("s_row", "row"), Table("s_key", "key"), Table("s_table", "table")]


def spec_of(t: Table, name: str | None = None) -> FenceSpec:
    table = TableName("app", name or t.name)
    if t.scope == "key":
        return FenceSpec(table, scope=Scope.KEY, key=t.key)
    if t.scope == "table":
        return FenceSpec(table, scope=Scope.TABLE)
    return FenceSpec(table)


Conn = psycopg.Connection[Any]


@dataclass
class Planted:
    server: EmbeddedServer
    template: str
    owner: str
    writer: str
    admin: str
    labels: list[str]
    _observers: dict[str, Conn] = field(default_factory=dict)

    def dsn(self, dbname: str, user: str | None = None) -> str:
        return self.server.dsn_for(dbname, user)

    @contextlib.contextmanager
    def fresh(self) -> Iterator[str]:
        """A new database copied from the template; yields its name, drops it after."""
        name = f"canary_{secrets.token_hex(5)}"
        with psycopg.connect(self.server.dsn, autocommit=True) as su:
            su.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(self.template)
                )
            )
        try:
            yield name
        finally:
            observer = self._observers.pop(name, None)
            if observer is not None:
                observer.close()
            with psycopg.connect(self.server.dsn, autocommit=True) as su:
                su.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))

    def hits(self, dbname: str) -> dict[str, dict[str, Any]]:
        """label -> {owner, writer, other: counts; role, session: who ran it as 'other'}.

        Read on one observer session per database (sequences are not transactional)."""
        su = self._observers.get(dbname)
        if su is None or su.closed:
            su = self._observers[dbname] = psycopg.connect(self.dsn(dbname), autocommit=True)
        rows = su.execute(
            "SELECT s.sequencename, s.last_value FROM pg_catalog.pg_sequences s "
            "WHERE s.schemaname = 'canary_log'"
        ).fetchall()
        out: dict[str, dict[str, Any]] = {}
        names: dict[int, str] | None = None
        for seq, value in rows:
            label, part = seq.rsplit(":", 1)
            entry = out.setdefault(label, {})
            if part in ("role", "session"):
                if value and names is None:
                    names = dict(su.execute("SELECT oid::bigint, rolname FROM pg_roles").fetchall())
                entry[part] = (names or {}).get(value, value) if value else None
            else:
                entry[part] = int(value or 0)
        return out


def _available_extension(conn: Conn) -> str:
    for name in ("citext", "hstore", "vector"):
        row = conn.execute(
            "SELECT 1 FROM pg_available_extensions WHERE name = %s", (name,)
        ).fetchone()
        if row:
            return name
    raise RuntimeError("no extension to hand to the owner (extension-member)")


def _protect(server: EmbeddedServer, template: str, owner: str, t: Table) -> None:
    """Protect as the DBA; where fencekit refuses because the DDL would run the owner's
    code in the DBA's session, as the owner, made a member of fencekit_admin as the refusal
    asks (its generated functions, owned by it, call fencekit's admin-only functions, so it
    stays one)."""
    with psycopg.connect(server.dsn_for(template)) as su:
        try:
            for stmt in protect_statements(spec_of(t)):
                su.execute(stmt.encode())
            su.commit()
            return
        except psycopg.errors.InsufficientPrivilege:
            su.rollback()
        su.execute(f"GRANT fencekit_admin TO {owner}")
        # Only the installer and superusers create in schema fencekit: the DBA lets the owner
        # create its table's functions for this protect only (docs/security.md).
        su.execute(f"GRANT CREATE ON SCHEMA fencekit TO {owner}")
        su.commit()
    with psycopg.connect(server.dsn_for(template, owner)) as oc:
        for stmt in protect_statements(spec_of(t)):
            oc.execute(stmt.encode())
    with psycopg.connect(server.dsn_for(template)) as su:
        su.execute(f"REVOKE CREATE ON SCHEMA fencekit FROM {owner}")


def _build(server: EmbeddedServer, template: str, sfx: str) -> Planted:
    owner, writer, admin = f"cn_owner_{sfx}", f"cn_writer_{sfx}", f"cn_admin_{sfx}"
    labels = sorted(_plant.page_mechanisms())
    with psycopg.connect(server.dsn, autocommit=True) as su:
        su.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(template)))
        for role in (owner, writer, admin):
            su.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    with psycopg.connect(server.dsn_for(template)) as su:
        su.execute(render_install().encode())
        su.execute(
            f"REVOKE CREATE ON SCHEMA public FROM PUBLIC; GRANT CREATE ON SCHEMA public TO {owner}"
        )
        su.execute(f"GRANT CREATE ON DATABASE {template} TO {owner}")
        su.execute(f"GRANT fencekit_admin TO {admin}; GRANT fencekit_writer TO {writer}, {owner}")
        su.execute(f"CREATE SCHEMA app AUTHORIZATION {owner}")
        su.commit()
        ext = _available_extension(su)
    owner_dsn = server.dsn_for(template, owner)
    canary = _plant.CANARY.replace("{owner}", owner).replace("{writer}", writer)
    with psycopg.connect(owner_dsn) as oc:
        oc.execute(canary.encode())
        oc.execute(_plant.sequences(labels).encode())
        oc.execute(_plant.HELPERS.encode())
        oc.execute(_plant.EXTENSION.encode())
        oc.commit()
    with psycopg.connect(server.dsn_for(template)) as su:
        # extension-member (see _plant.EXTENSION)
        su.execute(f"CREATE EXTENSION {ext} SCHEMA public")
        su.execute(
            "UPDATE pg_extension SET extowner = %s::regrole WHERE extname = %s", (owner, ext)
        )
        su.commit()
    with psycopg.connect(owner_dsn) as oc:
        oc.execute(f"ALTER EXTENSION {ext} ADD FUNCTION app.ext_member()")
        oc.execute(_plant.shadow_sql().encode())
        for t in PROTECTED + PARTITIONED + UNPROTECTED + SWAPPED:
            oc.execute(_plant.table_sql(t).encode())
        oc.execute(f"GRANT USAGE ON SCHEMA app TO {writer}, {admin}")
        oc.execute(
            "GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON ALL TABLES IN SCHEMA app "
            f"TO {writer}"
        )
        oc.commit()
    for t in PROTECTED + PARTITIONED + SWAPPED:
        _protect(server, template, owner, t)
    with psycopg.connect(owner_dsn) as oc:
        oc.execute("SELECT set_config('fencekit.token', %s, true)", (str(FENCE),))
        for t in PROTECTED + PARTITIONED + UNPROTECTED + SWAPPED:
            oc.execute(_plant.rows_sql(t).encode())
        oc.commit()
        for t in SWAPPED:
            oc.execute(_plant.view_swap_sql(t).encode())
        oc.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA app TO {writer}")
        oc.commit()
    with psycopg.connect(server.dsn_for(template), autocommit=True) as su:
        su.execute("ANALYZE")
        su.execute(sql.SQL("ALTER DATABASE {} IS_TEMPLATE true").format(sql.Identifier(template)))
    return Planted(server, template, owner, writer, admin, labels)


@pytest.fixture(scope="session")
def planted(pg_server: EmbeddedServer) -> Iterator[Planted]:
    sfx = secrets.token_hex(3)
    template = f"canary_tpl_{sfx}"
    try:
        yield _build(pg_server, template, sfx)
    finally:
        with psycopg.connect(pg_server.dsn, autocommit=True) as su:
            su.execute(
                sql.SQL("ALTER DATABASE {} IS_TEMPLATE false").format(sql.Identifier(template))
            )
            su.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(template))
            )
            for role in (f"cn_owner_{sfx}", f"cn_writer_{sfx}", f"cn_admin_{sfx}"):
                su.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
