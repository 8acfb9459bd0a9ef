"""Canary matrix: every SECURITY DEFINER function fencekit installs or generates, called by a
superuser, a fencekit_admin member and the writer, and every trigger fencekit generates, fired
by the writer's own statement. No planted canary may run as anyone but the owner or the writer.

The functions and triggers are read from pg_proc and pg_trigger after protect, not listed."""

from __future__ import annotations

import psycopg
import pytest

from tests.security.canary._builders import COMMIT_TRIGGER_CALLS, definer_calls, trigger_writes
from tests.security.canary._cells import Matrix
from tests.security.canary.conftest import FRESH, Planted

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)

DEFINERS = """
SELECT p.proname, p.oid::regprocedure::text, p.prorettype = 'trigger'::regtype
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE p.prosecdef AND (n.nspname = 'fencekit'
       OR pg_catalog.obj_description(p.oid, 'pg_proc') LIKE 'fencekit %')
 ORDER BY 2
"""
GENERATED_TRIGGERS = """
SELECT t.tgrelid::regclass::text, t.tgname, t.tgtype, t.tgfoid::regprocedure::text
  FROM pg_trigger t
 WHERE NOT t.tgisinternal
   AND pg_catalog.obj_description(t.oid, 'pg_trigger') LIKE 'fencekit %'
 ORDER BY 1, 2
"""


def _call(dsn: str, stmt: str, token: int | None = FRESH) -> None:
    """One statement in a fresh session, committed when it succeeds (COMMIT runs deferred
    code too)."""
    with psycopg.connect(dsn) as conn:
        try:
            if token is not None:
                conn.execute("SELECT set_config('fencekit.token', %s, true)", (str(token),))
            conn.execute(stmt)
            conn.commit()
        except psycopg.Error:
            conn.rollback()


def test_definer_functions(planted: Planted) -> None:
    matrix = Matrix()
    with planted.fresh() as db:
        with psycopg.connect(planted.dsn(db)) as su:
            found = su.execute(DEFINERS).fetchall()
            triggers = {r[3] for r in su.execute(GENERATED_TRIGGERS).fetchall()}
        assert found, "no SECURITY DEFINER function found"
        missing = []
        for proname, sig, returns_trigger in found:
            calls = definer_calls(proname, returns_trigger)
            if calls is None:
                missing.append(sig)
                continue
            if returns_trigger and proname not in COMMIT_TRIGGER_CALLS:
                assert sig in triggers, f"{sig}: a trigger function no generated trigger calls"
            for role in (None, planted.admin, planted.writer):
                for stmt in calls:
                    before = planted.hits(db)
                    _call(planted.dsn(db, role), stmt)
                    matrix.judge(f"{stmt} as {role or 'superuser'}", before, planted.hits(db))
    assert not missing, (
        f"SECURITY DEFINER functions with no argument builder: {missing}; add one to "
        "DEFINER_ARGS in tests/security/canary/_builders.py"
    )
    matrix.assert_clean()


def test_generated_triggers(planted: Planted) -> None:
    matrix = Matrix()
    with planted.fresh() as db:
        with psycopg.connect(planted.dsn(db)) as su:
            found = su.execute(GENERATED_TRIGGERS).fetchall()
        assert found, "no generated trigger found"
        for table, name, tgtype, _ in found:
            writes = trigger_writes(table, int(tgtype))
            assert writes, f"trigger {name} on {table}: no write fires it (tgtype {tgtype})"
            for stmt in writes:
                before = planted.hits(db)
                _call(planted.dsn(db, planted.writer), stmt)
                matrix.judge(f"{name}: {stmt} as the writer", before, planted.hits(db))
    matrix.assert_clean()
