"""The worker: rebuild one account's billing summary under the lease ``billing:<account_id>``.

It takes the lease from fencekit's issuer in the ``default`` database, reads the invoices,
computes (``checkpoint("computing")``: where a test pauses the worker; nothing at all in
production), then writes the summary: the fencekit app sends the lease's token with it.
"""

import os
import socket

from django.db.models import Count, Sum

from billing.models import BillingSummary, Invoice
from fencekit.django.leases import lease
from fencekit.testing import checkpoint

TTL = 1.5  # seconds: short, so that a test's pause outlives it quickly


def rebuild_summary(account_id: int, *, ttl: float = TTL) -> int:
    """Rebuild the summary of ``account_id``; returns the total."""
    with lease(f"billing:{account_id}", ttl=ttl, wait=30):
        totals = Invoice.objects.filter(account_id=account_id).aggregate(
            total=Sum("amount_cents", default=0), count=Count("id")
        )
        checkpoint("computing")
        BillingSummary.objects.update_or_create(
            account_id=account_id,
            defaults={
                "total_cents": totals["total"],
                "invoice_count": totals["count"],
                "rebuilt_by": f"{socket.gethostname()}:{os.getpid()}",
            },
        )
    return int(totals["total"])
