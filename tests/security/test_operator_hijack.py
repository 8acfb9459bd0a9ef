"""No fencekit SQL binds an operator planted in ``public``.

An operator in a later schema whose argument types match *exactly* beats pg_catalog's when
pg_catalog's needs a cast, even with pg_catalog searched first: ``public./(bigint, numeric)``
wins for ``bigint / 1000.0``, ``public.=(oid, regclass)`` for ``oid = regclass``. A role with
CREATE on ``public`` (``oh_evil``: not a superuser, no fencekit role) plants such operators for
every comparison, arithmetic and concatenation fencekit's SQL could write on catalog and
counter types; each one counts its calls in a sequence (a rollback does not undo that) and
tries to make ``oh_evil`` a superuser, then returns the right answer so nothing else breaks.

Then a superuser, under the default ``search_path`` (``"$user", public``), runs every way
fencekit's SQL reaches a database: ``fencekit install`` (first install and upgrade),
``protect``, ``status``, ``fences``, ``move``, ``unprotect``; the scripts ``fencekit sql``
prints, run as psql runs them (with and without their own transaction); the statement lists
the alembic operations run; the generated ``<tag>_cover()``. After each: no hostile operator
ran and ``oh_evil`` is not a superuser. Two static checks back it: every function fencekit
installs or generates pins its search_path or writes every operator OPERATOR(pg_catalog.x)
(the hot path, which cannot pay for a function-level SET), and nothing in schema fencekit
depends on an operator or function outside pg_catalog and fencekit.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest
from pglast.parser import scan

from fencekit import sqlgen
from fencekit.cli import main
from fencekit.spec import FenceSpec, Scope, TableName
from fencekit.sqlgen.pin import IN_TRANSACTION, pinned
from tests.security.conftest import Conn
from tests.sqlgen.golden_specs import SPECS

EVIL = "oh_evil"

_COMPARE = ("=", "<>", "<", ">", "<=", ">=")
# (operators, left type, right type, the type both sides are computed in, result type)
_HOSTILE = [
    *(
        (_COMPARE, left, right, "oid", "boolean")
        for left, right in [
            ("oid", "regclass"),
            ("regclass", "oid"),
            ("regclass", "regclass"),
            ("oid", "regnamespace"),
            ("oid", "regrole"),
            ("oid", "regproc"),
            ("oid", "regtype"),
        ]
    ),
    (_COMPARE, "bigint", "numeric", "numeric", "boolean"),
    (_COMPARE, "text", "regclass", "text", "boolean"),
    (("/", "*", "+", "-"), "bigint", "numeric", "numeric", "numeric"),
    (("/", "*", "+", "-"), "numeric", "bigint", "numeric", "numeric"),
    (("||",), "text", "name", "text", "text"),
    (("||",), "name", "text", "text", "text"),
    (("||",), "text", "regclass", "text", "text"),
]


def _hostile_sql() -> str:
    out = [
        "CREATE SEQUENCE public.oh_calls",
        "GRANT USAGE ON SEQUENCE public.oh_calls TO PUBLIC",
    ]
    n = 0
    for ops, left, right, via, result in _HOSTILE:
        for op in ops:
            n += 1
            out.append(
                f"CREATE FUNCTION public.oh_{n}(a {left}, b {right}) RETURNS {result} "
                "LANGUAGE plpgsql AS $f$\nBEGIN\n"
                "  PERFORM pg_catalog.nextval('public.oh_calls'::pg_catalog.regclass);\n"
                f"  BEGIN EXECUTE 'ALTER ROLE {EVIL} SUPERUSER';\n"
                "  EXCEPTION WHEN OTHERS THEN NULL; END;\n"
                f"  RETURN a::pg_catalog.{via} OPERATOR(pg_catalog.{op}) b::pg_catalog.{via};\n"
                "END $f$"
            )
            out.append(
                f"CREATE OPERATOR public.{op} (LEFTARG = {left}, RIGHTARG = {right}, "
                f"FUNCTION = public.oh_{n})"
            )
    return ";\n".join(out)


@pytest.fixture
def evil(make_role: Callable[..., str]) -> str:
    """``oh_evil``'s DSN: CREATE on public, nothing else."""
    return make_role(EVIL, "CREATE ON SCHEMA public")


def _plant(evil_dsn: str) -> None:
    with psycopg.connect(evil_dsn, autocommit=True) as conn:
        conn.execute(_hostile_sql().encode())


def _assert_clean(dsn: str, after: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT CASE WHEN s.is_called THEN s.last_value ELSE 0 END, r.rolsuper "
            "FROM public.oh_calls s, pg_catalog.pg_roles r "
            "WHERE r.rolname OPERATOR(pg_catalog.=) %s::pg_catalog.text",
            (EVIL,),
        ).fetchone()
    assert row is not None
    calls, superuser = row
    assert not superuser, f"{after}: {EVIL} became a superuser"
    assert calls == 0, f"{after}: a hostile operator from public ran {calls} time(s)"


def _cli(*argv: str) -> int:
    return main(list(argv))


def _run_script(dsn: str, script: str) -> None:
    """As psql -f runs it: one session, the default search_path, simple protocol."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(script.encode())


_PARTITIONED = (
    "CREATE TABLE public.oh_t (id int NOT NULL, k int NOT NULL, v text,"
    " PRIMARY KEY (id, k)) PARTITION BY RANGE (id);"
    "CREATE TABLE public.oh_t_1 PARTITION OF public.oh_t FOR VALUES FROM (0) TO (100);"
    "CREATE TABLE public.oh_kids (id int PRIMARY KEY, v text);"
    "CREATE TABLE public.oh_kid (extra int) INHERITS (public.oh_kids);"
    "INSERT INTO public.oh_t VALUES (1, 1, 'a')"
)


def _tables(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(_PARTITIONED.encode())


# ------------------------------------------------------------------------------ the CLI


def test_first_install_then_status(raw_dsn: str, evil: str) -> None:
    """F9: the views read by status must not bind public./(bigint, numeric)."""
    _plant(evil)
    assert _cli("install", "--dsn", raw_dsn) == 0
    _assert_clean(raw_dsn, "fencekit install")
    _tables(raw_dsn)
    assert _cli("protect", "public.oh_t", "--dsn", raw_dsn) == 0
    _assert_clean(raw_dsn, "fencekit protect")
    _cli("status", "--dsn", raw_dsn)
    _assert_clean(raw_dsn, "fencekit status")
    with psycopg.connect(raw_dsn, autocommit=True) as conn:
        conn.execute("SELECT * FROM fencekit.rejections")
        conn.execute("SELECT * FROM fencekit.lateness")
    _assert_clean(raw_dsn, "reading fencekit's views")
    _assert_no_outside_dependency(raw_dsn)


def test_upgrade_then_status(dsn: str, evil: str) -> None:
    """The upgrade re-creates the views: under the pin, over a planted operator."""
    _plant(evil)
    assert _cli("install", "--dsn", dsn) == 0
    _assert_clean(dsn, "fencekit install over an installed core")
    _cli("status", "--dsn", dsn)
    _assert_clean(dsn, "fencekit status")
    _assert_no_outside_dependency(dsn)


def test_protect_status_fences_move_unprotect(dsn: str, evil: str) -> None:
    """F10: every command a DBA runs, in the default search_path."""
    _tables(dsn)
    _plant(evil)
    steps = [
        ("protect", "oh_t"),  # unqualified: resolved through the user's path
        ("protect", "public.oh_kids", "--scope", "table"),
        ("status",),
        ("fences", "oh_t"),
        ("move", "public.oh_t", "--key", "k"),
        ("fences", "public.oh_t"),
        ("unprotect", "public.oh_t"),
        ("status",),
    ]
    for argv in steps:
        code = _cli(*argv, "--dsn", dsn)
        _assert_clean(dsn, f"fencekit {' '.join(argv)}")
        if argv[0] != "status":
            assert code == 0, argv
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE public.oh_kids RENAME TO oh_kids2")
    for argv in [
        ("rename", "oh_kids", "oh_kids2"),
        ("unprotect", "oh_kids2"),
        ("uninstall",),
    ]:
        assert _cli(*argv, "--dsn", dsn) == 0, argv
        _assert_clean(dsn, f"fencekit {' '.join(argv)}")


# --------------------------------------------------------------- scripts and statement lists


def test_printed_scripts(dsn: str, evil: str) -> None:
    """What ``fencekit sql`` prints, run as psql runs it by a superuser."""
    _tables(dsn)
    _plant(evil)
    row = FenceSpec(TableName("public", "oh_t"))
    key = FenceSpec(TableName("public", "oh_t"), scope=Scope.KEY, key=("k",))
    kids = FenceSpec(TableName("public", "oh_kids"), scope=Scope.TABLE)
    scripts = [
        ("install", sqlgen.render_install()),
        ("install --no-transaction", f"BEGIN;{sqlgen.render_install(transaction=False)}COMMIT;"),
        ("protect", sqlgen.render_protect(row)),
        (
            "protect --no-transaction",
            f"BEGIN;\n{sqlgen.render_protect(kids, transaction=False)}COMMIT;",
        ),
        ("move", sqlgen.render_move(row, key)),
        ("unprotect", sqlgen.render_unprotect(key)),
        (
            "unprotect --no-transaction",
            f"BEGIN;{sqlgen.render_unprotect(kids, transaction=False)}COMMIT;",
        ),
        ("uninstall", sqlgen.render_uninstall()),
    ]
    for what, script in scripts:
        _run_script(dsn, script)
        _assert_clean(dsn, f"fencekit sql {what}")


def test_alembic_statement_lists(dsn: str, evil: str) -> None:
    """The statement lists alembic's operations embed run pinned, and the migration gets its
    own search_path back."""
    from alembic.migration import MigrationContext
    from alembic.operations import Operations
    from sqlalchemy import create_engine

    from fencekit.alembic_plugin.ops import run_sql

    _tables(dsn)
    row = FenceSpec(TableName("public", "oh_t"))
    key = FenceSpec(TableName("public", "oh_t"), scope=Scope.KEY, key=("k",))
    engine = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(dsn))
    # SQLAlchemy's first connection runs its own catalog queries (under the hostile path they
    # call the planted operators too, then roll back): not fencekit's SQL, so before planting.
    engine.connect().close()
    _plant(evil)
    try:
        for what, statements in [
            ("install", sqlgen.install_statements()),
            ("protect", sqlgen.protect_statements(row)),
            ("move", sqlgen.change_statements(row, key)),
            ("unprotect", sqlgen.unprotect_statements(key)),
        ]:
            with engine.begin() as connection:
                connection.exec_driver_sql("SET search_path = public")
                run_sql(Operations(MigrationContext.configure(connection)), statements)
                path = connection.exec_driver_sql("SHOW search_path").scalar()
                assert path == "public", f"{what}: the caller's path is lost"
            _assert_clean(dsn, f"alembic {what}")
    finally:
        engine.dispose()


def test_pinned_refuses_autocommit(dsn: str) -> None:
    """In autocommit the pin would last one statement: the list's first statement is refused
    outside a transaction block, and (past it, e.g. psql without ON_ERROR_STOP) the restore
    still says so instead of passing."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        statements = pinned(["SELECT 1"])
        with pytest.raises(psycopg.errors.NoActiveSqlTransaction):
            conn.execute(statements[0].encode())
        for statement in statements[len(IN_TRANSACTION) : -1]:
            conn.execute(statement.encode())
        with pytest.raises(psycopg.DatabaseError, match="not pinned"):
            conn.execute(statements[-1].encode())


def test_cover_function_pins_its_path(db: Conn, dsn: str, evil: str) -> None:
    """``<tag>_cover()`` is called by protect and the auto-cover event trigger, and by an admin
    directly: it runs pg_catalog's operators whatever the caller's path."""
    _tables(dsn)
    assert _cli("protect", "public.oh_t", "--dsn", dsn) == 0
    _plant(evil)
    db.rollback()
    cover = db.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc p "
        "WHERE p.pronamespace OPERATOR(pg_catalog.=) 'fencekit'::regnamespace::oid "
        "AND p.proname::text LIKE 'oh_t_%_cover'"
    ).fetchone()
    assert cover is not None
    db.execute(f"SELECT {cover[0]}")
    db.commit()
    _assert_clean(dsn, "calling <tag>_cover()")


# ------------------------------------------------------------------------- static checks

#: Tokens that make the parser look an operator up by name in the search_path.
_OPERATOR_TOKENS = {
    "Op",
    "NOT_EQUALS",
    "LESS_EQUALS",
    "GREATER_EQUALS",
    "ASCII_60",  # <
    "ASCII_62",  # >
    "ASCII_61",  # =
    "ASCII_43",  # +
    "ASCII_45",  # -
    "ASCII_42",  # *
    "ASCII_47",  # /
    "ASCII_37",  # %
    "ASCII_94",  # ^
}
#: Keywords that resolve ``=`` (or ``~~``) by name: IN (...), IS DISTINCT FROM, NULLIF, LIKE...
_OPERATOR_KEYWORDS = {"DISTINCT", "LIKE", "ILIKE", "SIMILAR", "BETWEEN", "NULLIF", "IN_P"}


def unqualified_operators(body: str) -> list[str]:
    """Every operator in ``body`` (SQL or PL/pgSQL) not written OPERATOR(pg_catalog.x), with
    its context; ``-`` before a number (a negative constant) and ``*`` as a column list or
    count(*) are not operators."""
    toks = scan(body)
    found = []
    for i, tok in enumerate(toks):
        prev = toks[i - 1].name if i else ""
        nxt = toks[i + 1].name if i + 1 < len(toks) else ""
        if tok.name in _OPERATOR_TOKENS:
            qualified = (
                i >= 4
                and toks[i - 4].name == "OPERATOR"
                and body[toks[i - 2].start : toks[i - 2].end + 1] == "pg_catalog"
                and toks[i - 1].name == "ASCII_46"
            )
            negative = tok.name == "ASCII_45" and nxt in ("ICONST", "FCONST")
            star = tok.name == "ASCII_42" and prev in ("ASCII_40", "SELECT", "ASCII_44", "ASCII_46")
            if qualified or negative or star:
                continue
        elif tok.name not in _OPERATOR_KEYWORDS:
            continue
        found.append(body[max(0, tok.start - 50) : tok.end + 30].replace("\n", " "))
    return found


def test_scanner_finds_what_it_must() -> None:
    assert len(unqualified_operators("a < -1 AND count(*) > 0 AND b || c")) == 3
    assert len(unqualified_operators("a IS DISTINCT FROM b OR c IN (1, 2)")) == 2
    assert unqualified_operators("a OPERATOR(pg_catalog.<>) b, -1, count(*), t.*") == []


@pytest.mark.parametrize("name", sorted(SPECS))
def test_generated_functions_pin_or_qualify(name: str) -> None:
    """Every generated function pins search_path, or (hot path: a function-level SET costs on
    every call) writes every operator OPERATOR(pg_catalog.x); so does every WHEN clause."""
    objs = sqlgen.table_objects(SPECS[name])
    for f in objs.functions:
        if any(k == "search_path" for k, _ in f.settings):
            continue
        assert unqualified_operators(f.body) == [], f.name
    for tr in objs.triggers:
        if tr.when:
            assert unqualified_operators(tr.when) == [], tr.name


def test_installed_functions_pin_or_qualify(db: Conn, dsn: str) -> None:
    """The same for every function in schema fencekit once tables of each scope are
    protected: core functions, generated ones, the event trigger's."""
    _tables(dsn)
    for argv in [
        ("protect", "public.oh_t"),
        ("protect", "public.oh_kids", "--scope", "table"),
    ]:
        assert _cli(*argv, "--dsn", dsn) == 0
    db.rollback()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.oh_k (id int PRIMARY KEY, k int NOT NULL)")
    assert _cli("protect", "public.oh_k", "--key", "k", "--dsn", dsn) == 0
    rows = db.execute(
        "SELECT p.oid::regprocedure::text, p.proconfig, l.lanname, p.prosrc FROM pg_proc p "
        "JOIN pg_language l ON l.oid OPERATOR(pg_catalog.=) p.prolang "
        "WHERE p.pronamespace OPERATOR(pg_catalog.=) 'fencekit'::regnamespace::oid"
    ).fetchall()
    db.rollback()
    assert len(rows) > 20
    unpinned = []
    for signature, config, language, source in rows:
        if "search_path=pg_catalog, pg_temp" in (config or []):
            continue
        unpinned.append(signature)
        assert language in ("plpgsql", "sql"), signature
        assert unqualified_operators(source) == [], signature
    # Unpinned: the hot path only (the row and statement checks of the tables above, and the
    # attribution every tokenless statement in rollout mode calls); every other core function
    # and <tag>_cover() pin their path.
    hot = ("_stmt()", "_ins()", "_upd()", "_del()")
    assert unpinned
    slow = "fencekit.attribute(text,oid)"
    assert all((s.startswith("fencekit.oh_") and s.endswith(hot)) or s == slow for s in unpinned), (
        unpinned
    )


def _assert_no_outside_dependency(dsn: str) -> None:
    """No view or function in schema fencekit depends on an operator or function outside
    pg_catalog and fencekit (a view binds its operators when it is created)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            """
            SELECT pg_catalog.pg_describe_object(d.classid, d.objid, d.objsubid),
                   pg_catalog.pg_describe_object(d.refclassid, d.refobjid, d.refobjsubid)
              FROM pg_catalog.pg_depend d
              LEFT JOIN pg_catalog.pg_rewrite r
                ON d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_rewrite'::pg_catalog.regclass
               AND r.oid OPERATOR(pg_catalog.=) d.objid
              LEFT JOIN pg_catalog.pg_class v ON v.oid OPERATOR(pg_catalog.=) r.ev_class
              LEFT JOIN pg_catalog.pg_proc f
                ON d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
               AND f.oid OPERATOR(pg_catalog.=) d.objid
              LEFT JOIN pg_catalog.pg_operator o
                ON d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_operator'::pg_catalog.regclass
               AND o.oid OPERATOR(pg_catalog.=) d.refobjid
              LEFT JOIN pg_catalog.pg_proc g
                ON d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
               AND g.oid OPERATOR(pg_catalog.=) d.refobjid
             WHERE COALESCE(v.relnamespace, f.pronamespace)
                   OPERATOR(pg_catalog.=) 'fencekit'::pg_catalog.regnamespace::pg_catalog.oid
               AND COALESCE(o.oprnamespace, g.pronamespace) OPERATOR(pg_catalog.<>) ALL
                   (ARRAY['pg_catalog'::pg_catalog.regnamespace::pg_catalog.oid,
                          'fencekit'::pg_catalog.regnamespace::pg_catalog.oid])
            """
        ).fetchall()
    assert rows == [], rows


def test_the_dependency_check_sees_a_view_bound_to_public(dsn: str, evil: str) -> None:
    """The check above can fail: a view created in schema fencekit under the default path, as
    the install did before, binds public./(bigint, numeric) and is reported."""
    _plant(evil)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE VIEW fencekit.oh_v AS SELECT 1::bigint / 1000.0 AS x")
    with pytest.raises(AssertionError, match="oh_v"):
        _assert_no_outside_dependency(dsn)


def test_a_pinned_statement_list_refuses_autocommit_before_anything_runs(
    db: Conn, dsn: str
) -> None:
    """The second review's N1: in autocommit each statement is its own transaction, so the pin
    (set_config(..., true)) lasted one statement and the rest of a --no-transaction script, or
    of alembic's autocommit_block, ran under the caller's search_path; the final check came
    after earlier statements had committed. A pinned list now opens with a SAVEPOINT, which
    PostgreSQL refuses outside a transaction block: nothing of fencekit's runs."""
    db.execute("CREATE TABLE auto_t (id bigint PRIMARY KEY)")
    db.commit()
    spec = FenceSpec(TableName("public", "auto_t"))
    statements = pinned(sqlgen.protect_statements(spec))
    with (
        psycopg.connect(dsn, autocommit=True) as conn,
        pytest.raises(psycopg.errors.NoActiveSqlTransaction),
    ):
        conn.execute(statements[0].encode())  # psql -v ON_ERROR_STOP=1 stops here
    protected = db.execute(
        "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'public.auto_t'::regclass"
    ).fetchone()
    db.rollback()
    assert protected == (0,)
    # In a transaction the same list protects the table.
    with psycopg.connect(dsn) as conn:
        for stmt in statements:
            conn.execute(stmt.encode())
    assert db.execute(
        "SELECT count(*) > 0 FROM pg_trigger WHERE tgrelid = 'public.auto_t'::regclass"
    ).fetchone() == (True,)
    db.rollback()
