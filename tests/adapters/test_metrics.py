"""Client-side metrics: listeners, in-process tally, prometheus-client and OpenTelemetry."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import fencekit.psycopg as fkpg
from fencekit import metrics
from fencekit.context import fencing
from fencekit.errors import StaleTokenError


def provoke_stale(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        fkpg.install(conn)
        with fencing(34):
            conn.execute("UPDATE billing_summary SET summary = 'B'")
            conn.commit()
        with fencing(33), pytest.raises(StaleTokenError):
            conn.execute("UPDATE billing_summary SET summary = 'A'")


def test_prometheus_backend(billing: str) -> None:
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    listener = metrics.enable_prometheus(registry)
    try:
        provoke_stale(billing)
    finally:
        metrics.remove_listener(listener)
    value = registry.get_sample_value(
        "fencekit_client_rejected_writes_total",
        {"table": "public.billing_summary", "reason": "stale"},
    )
    assert value == 1.0


class RecordingMeter:
    """Stands in for an OpenTelemetry SDK meter (only the API package is installed)."""

    def __init__(self) -> None:
        self.added: list[tuple[str, int, dict[str, Any]]] = []
        self.recorded: list[tuple[str, float, dict[str, Any]]] = []  # histograms (lateness)

    def create_counter(self, name: str, **_: Any) -> Any:
        meter = self

        class Counter:
            def add(self, amount: int, attributes: dict[str, Any]) -> None:
                meter.added.append((name, amount, attributes))

        return Counter()

    def create_histogram(self, name: str, **_: Any) -> Any:
        meter = self

        class Histogram:
            def record(self, amount: float, attributes: dict[str, Any]) -> None:
                meter.recorded.append((name, amount, attributes))

        return Histogram()


def test_opentelemetry_backend(billing: str) -> None:
    meter = RecordingMeter()
    listener = metrics.enable_opentelemetry(meter)
    try:
        provoke_stale(billing)
        metrics.record_unfenced("public.other")
    finally:
        metrics.remove_listener(listener)
    assert meter.added == [
        (
            "fencekit.client.rejected_writes",
            1,
            {"table": "public.billing_summary", "reason": "stale"},
        ),
        ("fencekit.client.unfenced_writes", 1, {"table": "public.other", "reason": "unfenced"}),
    ]
    import opentelemetry.metrics  # the default meter path works without an SDK (no-op)

    metrics.remove_listener(metrics.enable_opentelemetry())
    assert opentelemetry.metrics.get_meter("fencekit") is not None


def test_failing_listener_never_hides_the_error(billing: str) -> None:
    def broken(event: metrics.MetricEvent) -> None:
        raise RuntimeError("sink down")

    remove = metrics.add_listener(broken)
    before = metrics.counts().get(("rejected", "public.billing_summary", "stale"), 0)
    try:
        provoke_stale(billing)  # still StaleTokenError, not RuntimeError
    finally:
        remove()
    assert metrics.counts()[("rejected", "public.billing_summary", "stale")] == before + 1
