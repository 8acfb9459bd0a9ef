"""Canary matrix: every alembic operation (from alembic's registry of fencekit's operations)
and every Django operation (from fencekit.django.operations), run as a superuser, each in a
fresh copy of the planted database. No planted canary may run as anyone but the owner or the
writer."""

from __future__ import annotations

import pytest

from tests.security.canary import _migrations as mig
from tests.security.canary._builders import TARGETS
from tests.security.canary._cells import Matrix
from tests.security.canary.conftest import Planted

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)


def test_alembic_operations(planted: Planted) -> None:
    matrix = Matrix()
    missing = mig.missing_alembic_builders()
    assert not missing, (
        f"alembic operations with no argument builder: {missing}; add one to "
        "alembic_instances in tests/security/canary/_migrations.py"
    )
    for name, cls in mig.alembic_ops().items():
        with planted.fresh() as db, mig.alembic_runner(planted.dsn(db)) as run:
            for table in TARGETS:
                for op in mig.alembic_instances(name, cls, table) or []:
                    before = planted.hits(db)
                    run(op)
                    matrix.judge(f"alembic {name} on app.{table.name}", before, planted.hits(db))
    matrix.assert_clean()


def test_django_operations(planted: Planted) -> None:
    matrix = Matrix()
    missing = mig.missing_django_builders()
    assert not missing, (
        f"Django operations with no argument builder: {missing}; add one to "
        "django_instances in tests/security/canary/_migrations.py"
    )
    for name, cls in mig.django_ops().items():
        with planted.fresh() as db:
            for table in TARGETS:
                for op in mig.django_instances(name, cls, table) or []:
                    before = planted.hits(db)
                    mig.run_django(planted.dsn(db), op)
                    matrix.judge(f"django {name} {op.describe()}", before, planted.hits(db))
    matrix.assert_clean()
