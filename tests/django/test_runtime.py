"""The token on Django's connections: autocommit writes, transaction.atomic(), savepoints,
scopes that end inside a transaction, callproc() and COPY, async ORM calls and an ASGI view.

Rejections reach Django code as fencekit's class that is also django.db.DatabaseError, with the
driver's error as __cause__.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from asgiref.sync import sync_to_async
from django.db import DatabaseError, connection, connections, transaction
from django.test import AsyncClient

from fencekit import MissingTokenError, StaleTokenError, fencing
from fencekit.django import runtime
from fencekit.errors import FenceError, translate
from tests.django.shop.models import Account, BillingSummary, Job

pytestmark = pytest.mark.django_db(transaction=True)


def rejection(info: pytest.ExceptionInfo[DatabaseError]) -> FenceError:
    """The error Django code caught: fencekit's class and Django's DatabaseError at once."""
    assert isinstance(info.value, DatabaseError)
    assert isinstance(info.value, FenceError), f"not a fence rejection: {info.value!r}"
    assert translate(info.value.__cause__) is not None  # the driver's error, chained
    return info.value


@pytest.fixture
def account() -> Account:
    return Account.objects.create(name="acme")  # not fenced


def test_the_app_wires_every_connection() -> None:
    connection.ensure_connection()
    assert runtime.is_installed(connection)


def test_install_refuses_what_it_cannot_fence() -> None:
    with pytest.raises(
        TypeError, match=r"takes a Django database connection .* not builtins.object"
    ):
        runtime.install(object())  # type: ignore[arg-type]


def test_autocommit_writes_carry_the_token_and_a_stale_one_is_rejected(account: Account) -> None:
    assert connection.get_autocommit()
    with fencing(34):
        summary = BillingSummary.objects.create(account=account, total=1)
        BillingSummary.objects.filter(pk=summary.pk).update(total=2)
    with fencing(33), pytest.raises(DatabaseError) as info:
        BillingSummary.objects.filter(pk=summary.pk).update(total=99)
    error = rejection(info)
    assert isinstance(error, StaleTokenError)
    assert (error.token, error.fence) == (33, 34)
    assert error.table == "public.shop_billingsummary"
    assert BillingSummary.objects.get(pk=summary.pk).total == 2
    assert connection.get_autocommit()  # the statement's own transaction is over


def test_a_write_outside_any_scope_is_refused(account: Account) -> None:
    with pytest.raises(DatabaseError) as info:
        BillingSummary.objects.create(account=account)
    assert isinstance(rejection(info), MissingTokenError)
    assert not BillingSummary.objects.exists()


def test_inside_atomic_the_token_is_set_once_per_transaction(
    account: Account, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[str, str]] = []  # what the transaction was given
    alone: list[tuple[str, str]] = []  # ... of it in a statement (a round trip) of its own
    note, send = runtime._State.sent, runtime._send

    def noting(state, value, *, open_after):  # type: ignore[no-untyped-def]
        sent.append(value)
        note(state, value, open_after=open_after)

    def sending(conn, value, status):  # type: ignore[no-untyped-def]
        alone.append(value)
        send(conn, value, status)

    monkeypatch.setattr(runtime._State, "sent", noting)
    monkeypatch.setattr(runtime, "_send", sending)
    with fencing(34), transaction.atomic():
        BillingSummary.objects.create(account=account)
        BillingSummary.objects.create(account=account)
        BillingSummary.objects.filter(account=account).update(total=5)
    assert sent == [("34", "")]
    assert alone == []  # it rode the first statement's query, behind the driver's BEGIN
    with fencing(35):  # autocommit: the token rides each statement's own query
        # What Django reads back is the statement's own result, not the SET's
        assert BillingSummary.objects.filter(account=account).update(total=6) == 2
        assert BillingSummary.objects.filter(account=account).update(total=7) == 2
        created = BillingSummary.objects.create(account=account, total=7)
        assert BillingSummary.objects.get(pk=created.pk).total == 7  # INSERT ... RETURNING id
        created.delete()
    assert sent == [("34", "")]  # no statement of its own
    with fencing(34), pytest.raises(DatabaseError) as info:  # and it was 35: the fence says so
        BillingSummary.objects.filter(account=account).update(total=8)
    assert (rejection(info).token, rejection(info).fence) == (34, 35)
    assert list(BillingSummary.objects.values_list("total", flat=True)) == [7, 7]


def test_a_stale_write_inside_atomic_rolls_the_whole_block_back(account: Account) -> None:
    with fencing(34):
        BillingSummary.objects.create(account=account)

    @fencing(33)
    @transaction.atomic
    def write_both() -> None:
        Job.objects.create(name="written first")  # the row fence's first token: accepted
        BillingSummary.objects.filter(account=account).update(total=7)

    with pytest.raises(DatabaseError) as info:
        write_both()
    assert isinstance(rejection(info), StaleTokenError)
    assert not Job.objects.exists()
    assert BillingSummary.objects.get().total == 0


def test_leaving_the_scope_inside_atomic_clears_the_token(account: Account) -> None:
    @transaction.atomic
    def scope_then_none() -> None:
        with fencing(34):
            BillingSummary.objects.create(account=account)
        BillingSummary.objects.create(account=account)  # same transaction, no scope

    with pytest.raises(DatabaseError) as info:
        scope_then_none()
    assert isinstance(rejection(info), MissingTokenError)


def test_an_inner_scope_with_another_token_is_sent(account: Account) -> None:
    with fencing(40):
        BillingSummary.objects.create(account=account)

    @fencing(41)
    @transaction.atomic
    def outer_then_inner() -> None:
        BillingSummary.objects.filter(account=account).update(total=1)
        with fencing(39):
            BillingSummary.objects.filter(account=account).update(total=2)

    with pytest.raises(DatabaseError) as info:
        outer_then_inner()
    assert isinstance(rejection(info), StaleTokenError)
    assert rejection(info).token == 39


def test_a_rolled_back_savepoint_does_not_take_the_token_with_it(account: Account) -> None:
    # The token set inside a savepoint goes when the savepoint is rolled back: the next
    # statement must set it again, or it would be refused as unfenced.
    @transaction.atomic
    def fails_in_a_savepoint() -> None:
        BillingSummary.objects.create(account=account, total=1)
        raise RuntimeError("undo the savepoint")

    with fencing(34), transaction.atomic():
        with pytest.raises(RuntimeError):
            fails_in_a_savepoint()
        BillingSummary.objects.create(account=account, total=2)
    assert list(BillingSummary.objects.values_list("total", flat=True)) == [2]


def test_no_token_is_left_on_the_connection_after_a_scope(account: Account) -> None:
    with fencing(34), transaction.atomic():
        BillingSummary.objects.create(account=account)
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('fencekit.token', true)")
        assert cursor.fetchone()[0] in (None, "")
    with pytest.raises(DatabaseError) as info:
        BillingSummary.objects.create(account=account)
    assert isinstance(rejection(info), MissingTokenError)


@pytest.mark.django_db(transaction=True, databases=["default", "pooled"])
def test_a_pooled_connection_carries_no_token_to_its_next_user(account: Account) -> None:
    pooled = connections["pooled"]
    try:

        def backend_and_token() -> tuple[int, str | None]:
            with pooled.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid(), current_setting('fencekit.token', true)")
                pid, token = cursor.fetchone()
            return pid, token

        with fencing(34), transaction.atomic(using="pooled"):
            BillingSummary.objects.using("pooled").create(account_id=account.pk)
            first, token = backend_and_token()
            assert token == "34"
        with fencing(35):  # autocommit on the pool: the token ends with the statement
            BillingSummary.objects.using("pooled").filter(account_id=account.pk).update(total=1)
        pooled.close()  # back to the pool
        again, token = backend_and_token()
        assert again == first  # the same server connection, handed out again
        assert token in (None, "")
        with pytest.raises(DatabaseError) as info:
            BillingSummary.objects.using("pooled").create(account_id=account.pk)
        assert isinstance(rejection(info), MissingTokenError)
    finally:
        pooled.close()
        pooled.close_pool()


def test_row_fence_on_django_writes(account: Account) -> None:
    with fencing(10):
        job = Job.objects.create(name="export")
    with fencing(12):
        Job.objects.filter(pk=job.pk).update(state="running")
    job.state = "done"
    with fencing(11), pytest.raises(DatabaseError) as info:
        job.save(update_fields=["state"])
    assert isinstance(rejection(info), StaleTokenError)
    assert Job.objects.get(pk=job.pk).state == "running"


def test_server_side_cursors_in_a_scope(account: Account) -> None:
    # .iterator() reads through a named (server-side) cursor; the token must not be sent on it.
    with fencing(20):
        for n in range(3):
            Job.objects.create(name=f"job {n}")
    with fencing(21), transaction.atomic():
        names = [job.name for job in Job.objects.order_by("pk").iterator(chunk_size=1)]
        Job.objects.update(state="seen")
    assert names == ["job 0", "job 1", "job 2"]
    with fencing(22):  # autocommit: iterator() then runs in its own transaction
        assert len(list(Job.objects.iterator(chunk_size=2))) == 3
    assert set(Job.objects.values_list("state", flat=True)) == {"seen"}


SET_TOTAL = """CREATE OR REPLACE FUNCTION shop_set_total(a bigint, t int) RETURNS int
LANGUAGE sql AS $$ UPDATE shop_billingsummary SET total = t WHERE account_id = a RETURNING t $$"""


@pytest.fixture
def set_total(account: Account) -> None:
    """A function that writes the fenced table, and account's summary under token 34."""
    with connection.cursor() as cursor:
        cursor.execute(SET_TOTAL)
    with fencing(34):
        BillingSummary.objects.create(account=account, total=1)


def test_rejections_are_fencekits_class_and_djangos(set_total: None, account: Account) -> None:
    with fencing(33), pytest.raises(StaleTokenError) as info:
        BillingSummary.objects.filter(account=account).update(total=9)
    assert isinstance(info.value, DatabaseError)  # except DatabaseError: still catches it
    assert (info.value.token, info.value.fence) == (33, 34)
    assert info.value.table == "public.shop_billingsummary"
    assert info.value.__cause__ is not None
    assert info.value.orig is not None


def test_a_select_of_a_writing_function_in_autocommit_carries_the_token(
    set_total: None, account: Account
) -> None:
    """A SELECT is not a read when the function it calls writes: it carries the token too."""
    assert connection.get_autocommit()
    with connection.cursor() as cursor:
        with fencing(33), pytest.raises(StaleTokenError):
            cursor.execute("SELECT shop_set_total(%s, 9)", [account.pk])
        with pytest.raises(MissingTokenError):
            cursor.execute("SELECT shop_set_total(%s, 9)", [account.pk])
        with fencing(35):
            cursor.execute("SELECT shop_set_total(%s, 7)", [account.pk])
            assert cursor.fetchone() == (7,)  # the statement's own result, not the SET's
    assert BillingSummary.objects.get().total == 7


def test_callproc_inside_atomic_carries_exactly_the_scopes_token(
    set_total: None, account: Account
) -> None:
    @transaction.atomic
    def scope_then_callproc() -> None:
        with fencing(35):
            BillingSummary.objects.filter(account=account).update(total=2)
        with connection.cursor() as cursor:  # the scope ended: its token must not go on
            cursor.callproc("shop_set_total", [account.pk, 9])

    with pytest.raises(MissingTokenError):
        scope_then_callproc()
    with transaction.atomic():
        with fencing(35):
            BillingSummary.objects.filter(account=account).update(total=2)
        with fencing(36), connection.cursor() as cursor:  # a new scope: its own token
            cursor.callproc("shop_set_total", [account.pk, 3])
    with fencing(35), pytest.raises(StaleTokenError):  # 36 was the one sent
        BillingSummary.objects.filter(account=account).update(total=4)
    with fencing(37), connection.cursor() as cursor:  # autocommit: its own fenced transaction
        cursor.callproc("shop_set_total", [account.pk, 5])
    assert BillingSummary.objects.get().total == 5


def test_copy_inside_atomic_carries_exactly_the_scopes_token(
    set_total: None, account: Account
) -> None:
    copy_in = "COPY shop_billingsummary (account_id, total) FROM STDIN"

    @transaction.atomic
    def scope_then_copy() -> None:
        with fencing(35):
            BillingSummary.objects.filter(account=account).update(total=2)
        with connection.cursor() as cursor, cursor.copy(copy_in) as copy:
            copy.write_row((account.pk, 8))

    with pytest.raises(MissingTokenError):
        scope_then_copy()
    with (
        fencing(35),
        transaction.atomic(),
        connection.cursor() as cursor,
        cursor.copy(copy_in) as copy,
    ):
        copy.write_row((account.pk, 8))
    assert sorted(BillingSummary.objects.values_list("total", flat=True)) == [1, 8]


def test_executemany_in_autocommit(account: Account) -> None:
    with fencing(5), connection.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO shop_billingsummary (account_id, total) VALUES (%s, %s)",
            [(account.pk, 1), (account.pk, 2)],
        )
    assert BillingSummary.objects.count() == 2


@pytest.fixture(autouse=True)
async def _close_thread_connections() -> AsyncIterator[None]:
    """Async ORM calls run in asgiref's thread, on that thread's connection: close it, or the
    test database cannot be dropped at the end of the session."""
    yield
    await sync_to_async(connections.close_all)()


async def test_async_orm_calls_carry_the_scope_token() -> None:
    account = await Account.objects.acreate(name="async")
    async with fencing(34):
        await BillingSummary.objects.acreate(account=account)
    with pytest.raises(DatabaseError) as info:
        async with fencing(33):
            await BillingSummary.objects.filter(account=account).aupdate(total=3)
    assert isinstance(rejection(info), StaleTokenError)


async def test_sync_to_async_and_concurrent_tasks_keep_their_own_tokens() -> None:
    account = await Account.objects.acreate(name="tasks")

    @sync_to_async
    def write(total: int) -> None:
        with transaction.atomic():
            BillingSummary.objects.create(account=account, total=total)

    async def worker(token: int) -> str:
        async with fencing(token):
            try:
                await write(token)
            except DatabaseError as exc:
                return type(translate(exc.__cause__)).__name__
            return "ok"

    assert await worker(50) == "ok"
    results = await asyncio.gather(worker(51), worker(49), worker(52))
    assert results == ["ok", "StaleTokenError", "ok"]
    totals = [s.total async for s in BillingSummary.objects.order_by("total")]
    assert totals == [50, 51, 52]


async def test_an_asgi_view_writes_under_the_request_token() -> None:
    account = await Account.objects.acreate(name="asgi")
    async with fencing(34):
        await BillingSummary.objects.acreate(account=account)
    client = AsyncClient()
    ok = await client.get(f"/bump/{account.pk}/35")
    assert ok.status_code == 200, ok.content
    assert ok.json() == {"updated": 1}
    stale = await client.get(f"/bump/{account.pk}/34")
    assert stale.status_code == 409
    assert stale.json() == {"rejected": "stale", "fence": 35}
