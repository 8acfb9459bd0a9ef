"""Invoices, and one summary per account, fenced by the account: whoever holds the lease on
``billing:<account_id>`` writes it."""

from django.db import models

from fencekit.django import Fence


class Invoice(models.Model):
    account_id = models.IntegerField()
    amount_cents = models.IntegerField()


class BillingSummary(models.Model):
    account_id = models.IntegerField(unique=True)
    total_cents = models.BigIntegerField()
    invoice_count = models.IntegerField()
    rebuilt_by = models.TextField()

    class Meta:
        fence = Fence(scope="key", key=["account_id"])
