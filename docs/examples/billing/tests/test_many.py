"""Many billing workers under pauses and kills: the checker's verdict on what the table accepted."""

from billing.worker import rebuild_summary

from fencekit.testing import run_many


def test_many_workers(fenced_db):
    with fenced_db.connect() as conn:
        conn.execute("INSERT INTO invoices (account_id, amount_cents) VALUES (1, 100), (2, 200)")
    result = run_many(rebuild_summary, fenced_db.app_url, 1, copies=3, seconds=8)
    assert result.report.writes > 0
    # Each pause at the checkpoint made a stale write: the fence rejected it.
    assert result.report.pauses > 0
    assert result.rejections["public.billing_summary"].get("stale", 0) > 0, result.summary()
