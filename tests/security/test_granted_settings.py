"""Settings a DBA can grant that switch fencing off (docs/security.md), and the queries that
see them (what ``fencekit status`` warns about).

These are not holes fencekit can close from a trigger: each test shows the class is real (the
stale write lands), then that the detection query names it. On an unprotected configuration
the queries return nothing, so they can fail.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from tests.core.helpers import make_app_role, one, protect, rows, write

Conn = psycopg.Connection[Any]

# Roles (or PUBLIC) that may SET session_replication_role without being superuser (15+; the
# ACL also lists the bootstrap superuser, who may anyway).
SRR_GRANTEES = """
SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END
  FROM pg_catalog.pg_parameter_acl p, pg_catalog.aclexplode(p.paracl) a
 WHERE p.parname = 'session_replication_role' AND a.privilege_type = 'SET'
   AND NOT coalesce((SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.oid = a.grantee),
                    false)
"""
# Role and database defaults that set session_replication_role or a fencekit setting.
DEFAULTS = """
SELECT coalesce(r.rolname, '*'), coalesce(d.datname, '*'), c
  FROM pg_catalog.pg_db_role_setting s
  LEFT JOIN pg_catalog.pg_roles r ON r.oid = s.setrole
  LEFT JOIN pg_catalog.pg_database d ON d.oid = s.setdatabase
 CROSS JOIN LATERAL pg_catalog.unnest(s.setconfig) c
 WHERE c ~* '^fencekit\\.' OR (c ~* '^session_replication_role=' AND c !~* '=origin$')
"""
# Functions that switch session_replication_role for their body (a superuser's SECURITY
# DEFINER function with SET session_replication_role = replica runs its writes unchecked).
FUNCTIONS = """
SELECT p.oid::regprocedure::text, c
  FROM pg_catalog.pg_proc p CROSS JOIN LATERAL pg_catalog.unnest(p.proconfig) c
 WHERE c ~* '^session_replication_role=' AND c !~* '=origin$'
"""
# Foreign servers of this database whose connection options set a fencekit setting.
FDW_SERVERS = """
SELECT s.srvname::text, o
  FROM pg_catalog.pg_foreign_server s CROSS JOIN LATERAL pg_catalog.unnest(s.srvoptions) o
 WHERE o ~* '^options=.*fencekit\\.'
"""

# Protected tables (their partitions too) and fencekit's own tables in a subscription of this
# database: replicated rows overwrite local fences (a subscriber's rel list fills in when it
# first connects; a subscription alone is reported by the second query).
SUBSCRIBED = """
SELECT s.subname::text, sr.srrelid::regclass::text
  FROM pg_catalog.pg_subscription_rel sr
  JOIN pg_catalog.pg_subscription s ON s.oid = sr.srsubid
  JOIN pg_catalog.pg_class c ON c.oid = sr.srrelid
 WHERE c.relnamespace = 'fencekit'::regnamespace
    OR EXISTS (SELECT FROM fencekit.protected p
                CROSS JOIN LATERAL pg_catalog.pg_partition_tree(
                  pg_catalog.to_regclass(pg_catalog.format('%I.%I', p.schema_name,
                                                           p.table_name))) t
                WHERE t.relid = sr.srrelid)
"""
SUBSCRIPTIONS = """
SELECT s.subname::text FROM pg_catalog.pg_subscription s
 WHERE s.subdbid = (SELECT d.oid FROM pg_catalog.pg_database d
                     WHERE d.datname = pg_catalog.current_database())
"""


@pytest.fixture
def acct(db: Conn) -> None:
    db.execute("CREATE TABLE acct (id int PRIMARY KEY, v int)")
    db.commit()
    protect(db, "acct")
    write(db, 10, "INSERT INTO acct VALUES (1, 0)")


@pytest.mark.pg_since(15)
def test_a_granted_session_replication_role_skips_every_check(
    db: Conn, acct: None, make_role: Callable[..., str]
) -> None:
    app = make_app_role(make_role, "srr_app")
    assert rows(db, SRR_GRANTEES) == []
    db.execute("GRANT SET ON PARAMETER session_replication_role TO srr_app")
    db.commit()
    with psycopg.connect(app) as conn:
        conn.execute("SET session_replication_role = replica")
        conn.commit()
        write(conn, 5, "UPDATE acct SET v = 666 WHERE id = 1")  # stale, yet accepted
    assert one(db, "SELECT v FROM acct") == 666
    assert rows(db, SRR_GRANTEES) == [("srr_app",)]
    db.execute("REVOKE SET ON PARAMETER session_replication_role FROM srr_app")
    db.commit()


def test_a_token_from_the_connection_or_a_role_default_passes_every_fence(
    db: Conn, acct: None, make_role: Callable[..., str]
) -> None:
    app = make_app_role(make_role, "opt_app")
    assert rows(db, DEFAULTS) == []
    # What a postgres_fdw server's `options '-c fencekit.token=...'` does to its sessions.
    with psycopg.connect(make_conninfo(app, options="-c fencekit.token=99")) as conn:
        write(conn, None, "UPDATE acct SET v = 1 WHERE id = 1")  # no token of its own
    assert one(db, "SELECT fencekit_fence FROM acct") == 99
    dbname = db.info.dbname
    db.execute(f"ALTER ROLE opt_app IN DATABASE \"{dbname}\" SET fencekit.token = '500'")
    db.commit()
    with psycopg.connect(app) as conn:
        write(conn, None, "UPDATE acct SET v = 2 WHERE id = 1")
    assert one(db, "SELECT fencekit_fence FROM acct") == 500
    assert rows(db, DEFAULTS) == [("opt_app", dbname, "fencekit.token=500")]
    db.execute(f'ALTER ROLE opt_app IN DATABASE "{dbname}" RESET ALL')
    db.commit()


@pytest.mark.all_servers  # Debian's server ships postgres_fdw; the embedded one does not
def test_the_foreign_server_query(db: Conn) -> None:
    if one(db, "SELECT count(*) FROM pg_available_extensions WHERE name = 'postgres_fdw'") == 0:
        pytest.skip("postgres_fdw is not installed on this server")
    db.execute("CREATE EXTENSION postgres_fdw")
    db.execute(
        "CREATE SERVER here FOREIGN DATA WRAPPER postgres_fdw "
        "OPTIONS (dbname 'x', options '-c fencekit.token=9000000000')"
    )
    db.execute("CREATE SERVER clean FOREIGN DATA WRAPPER postgres_fdw OPTIONS (dbname 'x')")
    db.commit()
    assert rows(db, FDW_SERVERS) == [("here", "options=-c fencekit.token=9000000000")]


def test_the_subscription_queries(db: Conn, acct: None) -> None:
    """A subscriber cannot be built here (the test server's wal_level is replica); the queries
    run, see nothing on a database without subscriptions, and see one made without
    connecting."""
    assert rows(db, SUBSCRIBED) == []
    assert rows(db, SUBSCRIPTIONS) == []
    db.autocommit = True
    db.execute(
        "CREATE SUBSCRIPTION sub CONNECTION 'dbname=nowhere' PUBLICATION pub "
        "WITH (connect = false, slot_name = NONE)"
    )
    try:
        assert rows(db, SUBSCRIPTIONS) == [("sub",)]
        assert rows(db, SUBSCRIBED) == []  # no table listed until it connects
    finally:
        db.execute("DROP SUBSCRIPTION sub")


def test_the_function_query(db: Conn, acct: None, make_role: Callable[..., str]) -> None:
    assert rows(db, FUNCTIONS) == []
    db.execute(
        "CREATE FUNCTION public.load(v int) RETURNS void LANGUAGE sql SECURITY DEFINER "
        "SET session_replication_role = replica AS $$ UPDATE acct SET v = load.v $$"
    )
    db.execute("GRANT EXECUTE ON FUNCTION public.load(int) TO PUBLIC")
    db.commit()
    app = make_app_role(make_role, "fn_app")
    with psycopg.connect(app) as conn:
        write(conn, 5, "SELECT public.load(777)")  # stale token, yet the row changes
    assert one(db, "SELECT v FROM acct") == 777
    assert rows(db, FUNCTIONS) == [("load(integer)", "session_replication_role=replica")]
