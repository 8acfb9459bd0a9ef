"""A paused billing worker's stale summary is rejected when another took over its account."""

from billing.worker import rebuild_summary

from fencekit.testing import takeover


def test_takeover(fenced_db):
    with fenced_db.connect() as conn:
        conn.execute(
            "INSERT INTO billing_invoice (account_id, amount_cents) VALUES (42, 1250), (42, 750)"
        )
    result = takeover(rebuild_summary, 42, resource="billing:42", table="billing_billingsummary")
    assert result.a_outcome.rejected == "stale"
    assert result.b_outcome.value == 2000
