"""A paused billing worker's stale summary is rejected: the takeover, in one call and by hand."""

from billing.worker import rebuild_summary

from fencekit.testing import assert_rejections, paused, takeover


def seed(db, account_id):
    with db.connect() as conn:
        conn.execute(
            "INSERT INTO invoices (account_id, amount_cents) VALUES (%s, 1250), (%s, 750)",
            (account_id, account_id),
        )


def test_takeover(fenced_db):
    seed(fenced_db, 42)
    result = takeover(
        rebuild_summary, fenced_db.app_url, 42, resource="billing:42", table="billing_summary"
    )
    assert result.a_outcome.rejected == "stale"
    assert result.b_outcome.value == 2000


def test_paused_by_hand(fenced_db):
    seed(fenced_db, 7)
    a = fenced_db.spawn(rebuild_summary, fenced_db.app_url, 7, pause_at="computing")
    a.wait_for("computing")
    with paused(a, until_lease_expired="billing:7"):
        b = fenced_db.spawn(rebuild_summary, fenced_db.app_url, 7)
        assert b.join().ok
    assert a.join().rejected == "stale"
    assert_rejections("billing_summary", stale=1, missing=0)
    assert a.metrics[("rejected", "public.billing_summary", "stale")] == 1
