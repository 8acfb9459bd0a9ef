"""``status`` finds owner code on a protected table whatever kind of object runs it: a
domain's DEFAULT, a view column's DEFAULT, a multirange over a checked domain, a range's
``subtype_diff`` (run by a GiST index), a function the owner added to an extension it made.
``fencekit allow`` pins the whole definition: a BEGIN ATOMIC body, a CHECK added to a domain."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from fencekit.catalog import status
from fencekit.spec import FenceSpec, TableName
from tests.security.conftest import protect

Conn = psycopg.Connection[Any]

FN = """
CREATE FUNCTION public.swap() RETURNS int LANGUAGE plpgsql AS $$
BEGIN PERFORM set_config('fencekit.token', '9000', true); RETURN 0; END $$;
CREATE FUNCTION public.swapb(int) RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN RETURN true; END $$;
CREATE FUNCTION public.diff(float8, float8) RETURNS float8 LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN RETURN $1 - $2; END $$;
"""

CASES = {
    "domain DEFAULT": (
        "CREATE DOMAIN public.dd AS int DEFAULT public.swap();"
        "CREATE TABLE t (id int PRIMARY KEY, c public.dd)"
    ),
    "view column DEFAULT": (
        "CREATE TABLE t (id int PRIMARY KEY, c int);"
        "CREATE VIEW public.tv AS SELECT * FROM t;"
        "ALTER VIEW public.tv ALTER COLUMN c SET DEFAULT public.swap()"
    ),
    "multirange over a checked domain": (
        "CREATE DOMAIN public.dc AS int CHECK (public.swapb(VALUE));"
        "CREATE TYPE public.rc AS RANGE (subtype = public.dc, multirange_type_name = public.mrc);"
        "CREATE TABLE t (id int PRIMARY KEY, c public.mrc)"
    ),
    "range subtype_diff": (
        "CREATE TYPE public.rd AS RANGE (subtype = float8, subtype_diff = public.diff);"
        "CREATE TABLE t (id int PRIMARY KEY, c public.rd);"
        "CREATE INDEX ON t USING gist (c)"
    ),
    # no per-kind check knows these two: the catalog walk finds them
    "extended statistics": (
        "CREATE TABLE t (id int PRIMARY KEY, c int);"
        "CREATE STATISTICS public.st ON (public.swapb(c)) FROM t"
    ),
    "a function a BEGIN ATOMIC default calls": (
        "CREATE FUNCTION public.atomic() RETURNS int LANGUAGE sql "
        "BEGIN ATOMIC SELECT public.swap(); END;"
        "CREATE TABLE t (id int PRIMARY KEY, c int DEFAULT public.atomic())"
    ),
}
REACHES = {
    "range subtype_diff": "public.diff",
    "extended statistics": "public.swapb",
    "multirange over a checked domain": "public.swapb",
}


def _reported(conn: Conn, function: str) -> list[str]:
    conn.commit()
    st = status(conn)
    conn.rollback()
    return [d.message for d in st.all_drift() if function in d.message]


@pytest.mark.parametrize("case", list(CASES))
def test_status_reports_owner_code_of_every_kind(db: Conn, case: str) -> None:
    db.execute(FN)
    db.execute(CASES[case])
    protect(db, FenceSpec(TableName("public", "t")))
    assert _reported(db, REACHES.get(case, "public.swap()")), f"status misses {case}"


def test_status_reports_a_function_the_owner_added_to_its_extension(
    db: Conn, make_role: Callable[..., str]
) -> None:
    make_role("st_ext_owner", "CREATE ON SCHEMA public")
    ext = next(
        n
        for (n,) in db.execute(
            "SELECT name FROM pg_available_extensions WHERE name IN ('citext', 'hstore', 'vector') "
            "ORDER BY name"
        ).fetchall()
    )
    db.execute(f"CREATE EXTENSION {ext}")
    # as CREATE EXTENSION by the owner leaves it (this server may have no trusted extension)
    db.execute(
        "UPDATE pg_extension SET extowner = 'st_ext_owner'::regrole WHERE extname = %s", (ext,)
    )
    db.execute("SET ROLE st_ext_owner")
    db.execute(
        "CREATE FUNCTION public.ext_swap() RETURNS int LANGUAGE plpgsql AS $$ "
        "BEGIN PERFORM set_config('fencekit.token', '9000', true); RETURN 0; END $$"
    )
    db.execute(f"ALTER EXTENSION {ext} ADD FUNCTION public.ext_swap()")
    db.execute("RESET ROLE")
    db.execute("CREATE TABLE t (id int PRIMARY KEY, c int DEFAULT public.ext_swap())")
    protect(db, FenceSpec(TableName("public", "t")))
    found = _reported(db, "public.ext_swap")
    db.execute(f"DROP EXTENSION {ext} CASCADE; DROP TABLE t CASCADE")
    db.execute("REVOKE ALL ON SCHEMA public FROM st_ext_owner")
    db.commit()
    assert found, "status trusts an owner's extension member"


def _hashes(conn: Conn) -> set[str]:
    conn.commit()
    st = status(conn)
    conn.rollback()
    return {d.sha256 for d in st.all_drift() if d.sha256}


def test_allow_pins_a_begin_atomic_body(db: Conn) -> None:
    db.execute(
        "CREATE FUNCTION public.a() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; END;"
        "CREATE TABLE t (id int PRIMARY KEY, c int DEFAULT public.a())"
    )
    protect(db, FenceSpec(TableName("public", "t")))
    before = _hashes(db)
    db.execute(
        "CREATE OR REPLACE FUNCTION public.a() RETURNS int LANGUAGE sql "
        "BEGIN ATOMIC SELECT pg_catalog.length("
        "pg_catalog.set_config('fencekit.token', '9', true)); END"
    )
    after = _hashes(db)
    assert before
    assert after
    assert before != after, "a changed BEGIN ATOMIC body kept its hash"


def test_allow_pins_a_domains_constraints(db: Conn) -> None:
    db.execute(FN)
    db.execute(
        "CREATE DOMAIN public.dc AS int CHECK (public.swapb(VALUE));"
        "CREATE TABLE t (id int PRIMARY KEY, c public.dc)"
    )
    protect(db, FenceSpec(TableName("public", "t")))
    before = _hashes(db)
    db.execute("ALTER DOMAIN public.dc ADD CONSTRAINT more CHECK (VALUE > 0)")
    after = _hashes(db)
    assert before
    assert after
    assert before != after, "a CHECK added to a domain kept its hash"
