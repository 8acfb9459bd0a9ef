"""Shared pieces of the attack matrix (tests/security/test_matrix_*.py).

One database per matrix module (module scope): fencekit's core, three roles and the tables each
module builds. Every cell runs in its own transaction as one of the roles (``SET LOCAL ROLE``
from a superuser connection, so the role's rights and nothing more apply) and is rolled back;
fencekit's counters are sequences, so what a rejection counted survives the rollback.

Roles (cluster-wide, named per module so modules on two pytest workers never share one):

- ``app``: DML and TRUNCATE on schema public's tables, member of ``fencekit_writer``.
- ``owner``: owns the user tables, the hostile objects and schema ``evil``; not an admin.
- ``admin``: member of ``fencekit_admin`` with the app's table rights; not the tables' owner.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from fencekit.embedded import EmbeddedServer
from fencekit.sqlgen import render_install

Conn = psycopg.Connection[Any]

ROLES = ("app", "owner", "admin")


@dataclass(frozen=True)
class MatrixDB:
    """The module's database: a superuser connection and the real role names."""

    conn: Conn
    roles: dict[str, str]  # "app" -> "mxw_app", ...

    def role(self, name: str) -> str:
        return self.roles[name]


@contextlib.contextmanager
def matrix_database(
    server: EmbeddedServer, prefix: str, *, writers: tuple[str, ...] = ()
) -> Iterator[MatrixDB]:
    """A fresh database with the core installed and the three roles (and more application
    roles like app, named ``writers``); dropped afterwards."""
    dbname = f"fk_{prefix}"
    roles = {r: f"{prefix}_{r}" for r in (*ROLES, *writers)}
    with psycopg.connect(server.dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname))
        )
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
        for name in roles.values():
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))
    try:
        with psycopg.connect(server.dsn_for(dbname)) as conn:
            conn.execute(render_install().encode())
            conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
            for key, name in roles.items():
                role = sql.Identifier(name)
                conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(role))
                if key == "app" or key in writers:
                    conn.execute(sql.SQL("GRANT fencekit_writer TO {}").format(role))
                if key == "admin":
                    conn.execute(sql.SQL("GRANT fencekit_admin TO {}").format(role))
            owner = sql.Identifier(roles["owner"])
            conn.execute(sql.SQL("GRANT CREATE, USAGE ON SCHEMA public TO {}").format(owner))
            conn.execute(sql.SQL("CREATE SCHEMA evil AUTHORIZATION {}").format(owner))
            conn.execute(
                sql.SQL("GRANT USAGE ON SCHEMA evil TO {}, {}").format(
                    sql.Identifier(roles["app"]), sql.Identifier(roles["admin"])
                )
            )
            conn.commit()
            yield MatrixDB(conn, roles)
    finally:
        with psycopg.connect(server.dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname))
            )
            for name in roles.values():
                admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


def grant_tables(m: MatrixDB) -> None:
    """The app and admin roles' rights on every table in schema public (and evil's marker)."""
    for key in (k for k in m.roles if k != "owner"):
        m.conn.execute(
            sql.SQL(
                "GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON ALL TABLES IN SCHEMA public "
                "TO {}"
            ).format(sql.Identifier(m.role(key)))
        )


def rejections(conn: Conn) -> dict[str, int]:
    """Every table's rejection counts summed per reason (sequences: they survive rollbacks)."""
    conn.rollback()
    rows = conn.execute(
        "SELECT reason, sum(count)::bigint FROM fencekit.rejections GROUP BY reason"
    ).fetchall()
    conn.rollback()
    return {reason: int(n) for reason, n in rows}
