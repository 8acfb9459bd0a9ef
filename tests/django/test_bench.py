"""What the Django wiring costs: a one-row UPDATE through the ORM on the fenced table, under a
token, against the same UPDATE on an unfenced twin table with no token, in one run, in
transaction.atomic() and in autocommit. Reports ratios (docs/django.md); asserts no times."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from django.db import transaction
from django.db.models import F

from fencekit import fencing
from tests.django.shop.models import Account, BillingSummary, PlainSummary

pytestmark = [pytest.mark.bench, pytest.mark.django_db(transaction=True)]

ROUNDS, PER_ROUND = 9, 80


def _round(op: Callable[[], None]) -> float:
    start = time.perf_counter()
    for _ in range(PER_ROUND):
        op()
    return (time.perf_counter() - start) / PER_ROUND


def _best_of_pair(base: Callable[[], None], under: Callable[[], None]) -> tuple[float, float]:
    """Each side's best round, the rounds interleaved so both meet the same machine load."""
    best = [float("inf"), float("inf")]
    for _ in range(ROUNDS):
        best[0] = min(best[0], _round(base))
        best[1] = min(best[1], _round(under))
    return best[0], best[1]


def test_one_row_update_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    account = Account.objects.create(name="bench")
    with fencing(1):
        BillingSummary.objects.create(account=account)
    PlainSummary.objects.create(account=account)
    fenced_rows = BillingSummary.objects.filter(account=account)
    plain_rows = PlainSummary.objects.filter(account=account)

    def plain() -> None:
        plain_rows.update(total=F("total") + 1)

    def fenced() -> None:
        with fencing(2):
            fenced_rows.update(total=F("total") + 1)

    def in_atomic(op: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            with transaction.atomic():
                op()

        return run

    results = {}
    for name, base, under in (
        ("atomic()", in_atomic(plain), in_atomic(fenced)),
        ("autocommit", plain, fenced),
    ):
        base(), under()  # warm up
        results[name] = _best_of_pair(base, under)
    with capsys.disabled():
        for name, (base_s, fenced_s) in results.items():
            print(
                f"\ndjango one-row UPDATE, {name}: unfenced {base_s * 1e3:.3f} ms, "
                f"fenced {fenced_s * 1e3:.3f} ms, ratio {fenced_s / base_s:.2f}x"
            )
    assert BillingSummary.objects.get().total > 0
