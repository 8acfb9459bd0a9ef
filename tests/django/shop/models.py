"""Models of the test project: a key fence, a row fence and an unfenced table."""

from django.db import models

from fencekit.django import Fence


class Account(models.Model):
    name = models.CharField(max_length=100)


class BillingSummary(models.Model):
    """One fence per account: whoever holds the lease on the account writes its summary."""

    account = models.ForeignKey(Account, on_delete=models.CASCADE)
    total = models.IntegerField(default=0)

    class Meta:
        fence = Fence(scope="key", key=["account"])


class Job(models.Model):
    """A row fence: each job row carries its own fence."""

    name = models.CharField(max_length=100)
    state = models.CharField(max_length=20, default="queued")

    class Meta:
        fence = Fence()


class PlainSummary(models.Model):
    """BillingSummary's twin without a fence: the baseline of tests/django/test_bench.py."""

    account = models.ForeignKey(Account, on_delete=models.CASCADE)
    total = models.IntegerField(default=0)
