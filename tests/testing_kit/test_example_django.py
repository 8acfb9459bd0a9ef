"""The Django billing example's own tests, run as its users run them (pytester, a subprocess,
pytest-django): the kit's template is the project's migrations, and the workers it starts
connect to the test's database through their own DATABASES."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.multiproc


def test_the_django_example_suite_passes(django_example: pytest.Pytester) -> None:
    result = django_example.runpytest_subprocess("-p", "no:randomly", timeout=600)
    result.assert_outcomes(passed=1)


OUTSIDE = """
from billing.worker import rebuild_summary
from fencekit.testing import takeover


def test_takeover_writes_the_test_database(fenced_db):
    result = takeover(rebuild_summary, 7, resource="billing:7", table="billing_billingsummary")
    assert result.b_outcome.value == 0
    with fenced_db.connect() as conn:
        rows = conn.execute(
            "SELECT account_id, total_cents FROM billing_billingsummary"
        ).fetchall()
    assert rows == [(7, 0)]
"""


def test_workers_write_the_fenced_database_not_the_settings_one(
    django_example: pytest.Pytester,
) -> None:
    # The settings name a database on 127.0.0.1:5432 that does not exist here: a worker that
    # kept them could not even take its lease.
    django_example.makepyfile(test_outside=OUTSIDE)
    result = django_example.runpytest_subprocess(
        "-p", "no:randomly", "test_outside.py", timeout=600
    )
    result.assert_outcomes(passed=1)
