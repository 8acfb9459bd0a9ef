"""The runtime tests' core scenarios on Django's psycopg2 backend, in a process of its own.

Django picks psycopg 3 when it can import it; this script makes that import fail, so the same
project runs on psycopg2. tests/django/test_psycopg2.py runs it against the session's test
database (``FK_DJANGO_DB``: the settings to use, as JSON) and reads one JSON line of results.
"""

from __future__ import annotations

import json
import os
import sys

sys.modules["psycopg"] = None  # type: ignore[assignment]  # Django falls back to psycopg2

import django  # noqa: E402

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.django.settings"
django.setup()

from django.conf import settings  # noqa: E402
from django.db import DatabaseError, connection, transaction  # noqa: E402

from fencekit import fencing  # noqa: E402
from fencekit.django import runtime  # noqa: E402
from fencekit.errors import translate  # noqa: E402
from tests.django.shop.models import Account, BillingSummary  # noqa: E402


def cause_of(exc: DatabaseError) -> dict[str, object]:
    cause = exc.__cause__
    translated = translate(cause) if cause is not None else None
    return {
        "django": type(exc).__name__,
        "cause_module": type(cause).__module__,
        "sqlstate": getattr(cause, "pgcode", None) or getattr(cause, "sqlstate", None),
        "translated": None if translated is None else type(translated).__name__,
    }


def main() -> None:
    settings.DATABASES["default"].update(json.loads(os.environ["FK_DJANGO_DB"]))
    out: dict[str, object] = {"driver": connection.Database.__name__}
    account = Account.objects.create(name="psycopg2")
    out["installed"] = runtime.is_installed(connection)
    with fencing(34):
        BillingSummary.objects.create(account=account, total=1)  # autocommit
    with fencing(35), transaction.atomic():
        with transaction.atomic():  # a savepoint that fails and is rolled back
            BillingSummary.objects.filter(account=account).update(total=2)
            transaction.set_rollback(True)
        BillingSummary.objects.filter(account=account).update(total=3)
    out["total"] = BillingSummary.objects.get(account=account).total
    try:
        with fencing(34):
            BillingSummary.objects.filter(account=account).update(total=99)
    except DatabaseError as exc:
        out["stale"] = cause_of(exc)
    try:
        BillingSummary.objects.create(account=account)
    except DatabaseError as exc:
        out["missing"] = cause_of(exc)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
