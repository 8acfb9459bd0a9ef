"""The same scenario with the asyncio worker, from an async test."""

from billing.worker import rebuild_summary_async

from fencekit.testing import assert_rejections, atakeover


async def test_async_takeover(fenced_db):
    with fenced_db.connect() as conn:
        conn.execute("INSERT INTO invoices (account_id, amount_cents) VALUES (5, 999)")
    result = await atakeover(
        rebuild_summary_async, fenced_db.app_dsn, 5, resource="billing:5", table="billing_summary"
    )
    assert result.b_outcome.value == 999
    assert_rejections("billing_summary", stale=1)
