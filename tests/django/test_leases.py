"""A lease from the project's DATABASES: the issuer connects as Django does, and the lease's
token is what the app sends."""

from __future__ import annotations

import psycopg
import pytest
from django.db import DatabaseError, connections

from fencekit import fencing
from fencekit.django.leases import conninfo, issuer, lease
from fencekit.errors import StaleTokenError, translate
from tests.django.shop.models import Account, BillingSummary

pytestmark = pytest.mark.django_db(transaction=True)


def test_conninfo_is_the_connection_django_opens() -> None:
    info = conninfo()
    settings = connections["default"].settings_dict
    assert f"dbname={settings['NAME']}" in info
    with psycopg.connect(info) as conn:
        row = conn.execute("SELECT current_database(), current_user").fetchone()
    assert row == (settings["NAME"], settings["USER"])
    with issuer() as iss:  # fencekit's issuer answers there
        grant = iss.try_acquire("django:conninfo", "test", 5.0)
    assert grant is not None
    assert grant.token > 0


def test_a_lease_from_databases_fences_the_orm_and_a_stale_holder_is_rejected() -> None:
    account = Account.objects.create(name="acme")
    with lease(f"billing:{account.pk}", ttl=30) as first:
        summary = BillingSummary.objects.create(account=account, total=1)
        old = first.token
    with lease(f"billing:{account.pk}", ttl=30) as second:
        assert second.token > old
        BillingSummary.objects.filter(pk=summary.pk).update(total=2)
    with fencing(old), pytest.raises(DatabaseError) as info:
        BillingSummary.objects.filter(pk=summary.pk).update(total=99)
    assert isinstance(translate(info.value.__cause__), StaleTokenError)
    assert BillingSummary.objects.get(pk=summary.pk).total == 2


def test_another_backend_is_refused_with_a_sentence() -> None:
    wrapper = connections["default"]
    vendor = wrapper.vendor
    try:
        wrapper.vendor = "sqlite"
        with pytest.raises(ValueError, match="fencekit's issuer lives in PostgreSQL"):
            conninfo()
    finally:
        wrapper.vendor = vendor
