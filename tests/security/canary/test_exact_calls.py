"""Canary matrix, hostile overloads in schema fencekit: every call fencekit's own code makes
into a fencekit function passes exactly the parameter types, so no overload can win it.

PostgreSQL prefers a function whose argument types match a call exactly over one reached by an
implicit cast, even in the schema the call names. A call like
``fencekit.check_key_types('t', TG_RELID)`` (TG_RELID is ``oid``, the parameter ``regclass``)
inside a SECURITY DEFINER trigger function would run ``fencekit.check_key_types(text, oid)``
with the definer's rights, were anyone able to create it. Only the installer and superusers may
create in schema fencekit; this proves the second wall too.

The overloads are derived from the catalogs, not listed: for every function in schema fencekit,
every parameter, and every type PostgreSQL casts to that parameter's type implicitly
(``pg_cast``), an overload differing from the real one in that position alone. Each one counts
its calls in a sequence (sequences ignore rollbacks) and fails. Then every fenced write path of
every scope runs (writes with a token, a stale one, none in rollout mode and enforcing, a
bypass, TRUNCATE), then unprotect and protect again as the DBA and a lease's life as a writer;
no overload may have run, nor may a call fail as ambiguous.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.core.helpers import protect

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)

Conn = psycopg.Connection[Any]

# One overload per (function, parameter position, implicit source type), each counting its calls.
_PLANT = r"""
DO $plant$
DECLARE
  f record;
  i integer;
  src oid;
  args oid[];
  sig text;
  n integer := 0;
BEGIN
  CREATE SCHEMA hostile_log;
  CREATE SEQUENCE hostile_log.hits;
  GRANT USAGE ON SCHEMA hostile_log TO PUBLIC;
  GRANT USAGE, UPDATE ON SEQUENCE hostile_log.hits TO PUBLIC;
  FOR f IN SELECT p.oid, p.proname, p.proargtypes::oid[] AS types, p.prorettype, p.prokind
             FROM pg_catalog.pg_proc p
            WHERE p.pronamespace = 'fencekit'::regnamespace AND p.pronargs > 0
              AND p.prokind = 'f'
  LOOP
    FOR i IN 1 .. pg_catalog.cardinality(f.types) LOOP
      FOR src IN SELECT c.castsource FROM pg_catalog.pg_cast c
                  WHERE c.casttarget = f.types[i] AND c.castcontext = 'i'
                    AND c.castsource <> f.types[i]
                    AND c.castsource NOT IN ('unknown'::regtype)
                    AND (SELECT t.typtype FROM pg_catalog.pg_type t WHERE t.oid = c.castsource)
                        IN ('b', 'd')
      LOOP
        args := f.types;
        args[i] := src;
        sig := pg_catalog.format('fencekit.%I(%s)', f.proname,
                 (SELECT pg_catalog.string_agg(a::regtype::text, ', ' ORDER BY o)
                    FROM pg_catalog.unnest(args) WITH ORDINALITY u(a, o)));
        CONTINUE WHEN pg_catalog.to_regprocedure(sig) IS NOT NULL;
        EXECUTE pg_catalog.format(
          'CREATE FUNCTION %s RETURNS %s LANGUAGE plpgsql AS $b$BEGIN '
          'PERFORM pg_catalog.nextval(''hostile_log.hits''); '
          'RAISE EXCEPTION ''hostile overload %s ran as %%'', current_user; END$b$',
          sig, f.prorettype::regtype, pg_catalog.replace(sig, '''', ''''''));
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO PUBLIC', sig);
        n := n + 1;
      END LOOP;
    END LOOP;
  END LOOP;
  RAISE NOTICE 'planted % overloads', n;
  IF n < 50 THEN
    RAISE EXCEPTION 'only % overloads planted: the enumeration found nothing to plant', n;
  END IF;
END
$plant$;
"""

SCOPES = {
    "x_row": {"scope": "row"},
    "x_key": {"scope": "key", "key": ("k",)},
    "x_table": {"scope": "table"},
}


def _hits(db: Conn) -> int:
    row = db.execute("SELECT last_value, is_called FROM hostile_log.hits").fetchone()
    db.commit()
    assert row is not None
    return int(row[0]) if row[1] else 0


def _write(dsn: str, stmts: list[str], token: int | None, *, bypass: bool = False) -> str:
    """Run ``stmts`` in one transaction; the error text, '' when it committed."""
    with psycopg.connect(dsn) as c:
        try:
            if token is not None:
                c.execute("SELECT set_config('fencekit.token', %s, true)", [str(token)])
            if bypass:
                c.execute("SELECT set_config('fencekit.bypass', 'on', true)")
            for s in stmts:
                c.execute(s)
            c.commit()
        except psycopg.Error as e:
            return str(e).splitlines()[0]
    return ""


@pytest.mark.parametrize("on_missing", ["allow", "reject"])
def test_no_overload_in_schema_fencekit_wins_a_call_of_fencekits_own(
    db: Conn, make_role: Any, on_missing: str
) -> None:
    for name, kw in SCOPES.items():
        db.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, k int NOT NULL, v text)")
        db.commit()
        protect(db, name, on_missing=on_missing, **kw)  # type: ignore[arg-type]
    writer = make_role(
        "xc_writer", "SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON ALL TABLES IN SCHEMA public"
    )
    admin = make_role(
        "xc_admin",
        "fencekit_admin",
        "SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON ALL TABLES IN SCHEMA public",
    )
    db.execute(_PLANT)
    db.commit()
    assert _hits(db) == 0
    failures: list[str] = []
    for name in SCOPES:
        cases: list[tuple[str, list[str], int | None, bool, bool]] = [
            # (what, statements, token, bypass, must commit)
            ("insert", [f"INSERT INTO {name} VALUES (1, 1, 'a'), (2, 2, 'b')"], 10, False, True),
            ("update", [f"UPDATE {name} SET v = 'c'"], 11, False, True),
            ("stale update", [f"UPDATE {name} SET v = 'd'"], 5, False, False),
            ("delete", [f"DELETE FROM {name} WHERE id = 2"], 12, False, True),
            ("unfenced", [f"UPDATE {name} SET v = 'e'"], None, False, on_missing == "allow"),
            ("bypass", [f"UPDATE {name} SET v = 'f'"], None, True, True),
            ("truncate", [f"TRUNCATE {name}"], 13, False, True),
        ]
        for what, stmts, token, bypass, commits in cases:
            role = admin if bypass else writer
            err = _write(role, stmts, token, bypass=bypass)
            if "hostile overload" in err or "is not unique" in err or (commits and err):
                failures.append(f"{name} {what}: {err or 'committed'}")
            elif not commits and not err:
                failures.append(f"{name} {what}: committed, expected a refusal")
    # The DDL side: protect and unprotect (as the DBA) and a lease's life (as a writer).
    from fencekit import sqlgen
    from fencekit.spec import FenceSpec, Scope, TableName

    for name, kw in SCOPES.items():
        spec = FenceSpec(
            TableName("public", name),
            scope=Scope(kw["scope"]),
            key=kw.get("key", ()),
            on_missing=on_missing,
        )
        for what, stmts in (
            ("unprotect", sqlgen.unprotect_statements(spec)),
            ("protect", sqlgen.protect_statements(spec)),
        ):
            err = _write(db.info.dsn, list(stmts), None)
            if err:
                failures.append(f"{name} {what}: {err}")
    db.execute("GRANT fencekit_writer TO xc_writer")
    db.commit()
    lease = [
        "SELECT fencekit.acquire('xc', 'w1', interval '1 minute')",
        "SELECT fencekit.renew('xc', 'w1', (SELECT token FROM fencekit.leases_current"
        " WHERE resource = 'xc'), interval '1 minute')",
        "SELECT fencekit.release('xc', 'w1', (SELECT token FROM fencekit.leases_current"
        " WHERE resource = 'xc'))",
    ]
    err = _write(writer, lease, None)
    if err:
        failures.append(f"lease: {err}")
    assert not failures, "\n".join(failures)
    assert _hits(db) == 0
