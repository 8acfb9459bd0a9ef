"""The billing example's own tests, run as its users run them (pytester, a subprocess), and the
example with fencing switched off: the kit must report the lost update, readably."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.multiproc


def test_the_example_suite_passes(example: pytest.Pytester) -> None:
    result = example.runpytest_subprocess("-p", "no:randomly", "--durations=0", timeout=600)
    result.assert_outcomes(passed=4)
    print("\n".join(line for line in result.outlines if "s call" in line))


UNFENCED = '''
import psycopg
from sqlalchemy import create_engine

from billing.models import metadata
from billing.worker import rebuild_summary
from fencekit.testing import takeover
from pytest_fencekit import fenced_database


def tables_without_fences(dsn):
    """The same tables, created without their fence: fencing switched off."""
    engine = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(dsn))
    metadata.create_all(engine)
    engine.dispose()


unfenced_db = fenced_database(schema=tables_without_fences)


def test_takeover_without_fencing(unfenced_db):
    with unfenced_db.connect() as conn:
        conn.execute("INSERT INTO invoices (account_id, amount_cents) VALUES (42, 500)")
    takeover(rebuild_summary, unfenced_db.app_url, 42, resource="billing:42",
             table="billing_summary")
'''


def test_the_lost_update_without_fencing_is_reported(example: pytest.Pytester) -> None:
    example.makepyfile(test_unfenced=UNFENCED)
    result = example.runpytest_subprocess("-p", "no:randomly", "test_unfenced.py", timeout=600)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*LOST UPDATE: worker A resumed after its lease on 'billing:42' had expired (A held "
            "token *, B took over with token *) and its stale write to public.billing_summary "
            "was ACCEPTED, overwriting what B wrote.",
            "*why: public.billing_summary is not protected by fencekit*",
            "*public.billing_summary: NOT PROTECTED*",
            "*output of worker A*",
        ]
    )


UNFENCED_MANY = """
from billing.worker import rebuild_summary
from fencekit.testing import run_many
from pytest_fencekit import fenced_database
from test_unfenced import tables_without_fences

unfenced_db = fenced_database(schema=tables_without_fences)


def test_many_without_fencing(unfenced_db):
    with unfenced_db.connect() as conn:
        conn.execute("INSERT INTO invoices (account_id, amount_cents) VALUES (1, 100)")
    run_many(rebuild_summary, unfenced_db.app_url, 1, copies=3, seconds=8, kills=False,
             tables=("billing_summary",))
"""


def test_many_workers_without_fencing_get_the_checkers_verdict(example: pytest.Pytester) -> None:
    example.makepyfile(test_unfenced=UNFENCED, test_unfenced_many=UNFENCED_MANY)
    result = example.runpytest_subprocess("-p", "no:randomly", "test_unfenced_many.py", timeout=600)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*violation(s) in 3 copies of billing.worker:rebuild_summary over 8s under pauses:",
            "*stale writes attempted*accepted*",
            "*VIOLATIONS: stale write accepted x*",
            "*stale write accepted on public.billing_summary:1: write * with token * committed "
            "at seq * after write * with token *",
            "*timeline: */timeline.html",
        ]
    )
