"""Client-side counters of rejected and unfenced writes, by table and reason.

The adapters call :func:`record_rejection` for every :class:`~fencekit.errors.FenceError` they
raise and :func:`record_unfenced` for every write they send without a token (the SQLAlchemy
plugin knows the target table; raw psycopg does not, so it counts rejections only). Events go to:

- an in-process tally, :func:`counts` (always on, thread-safe);
- listeners registered with :func:`add_listener` (anything: logs, statsd, tests);
- prometheus-client and OpenTelemetry, after :func:`enable_prometheus` /
  :func:`enable_opentelemetry` (their packages are imported only then).

A rejected token on a key or table fence also carries its *lateness* (``MetricEvent.lateness``,
seconds): how long before the rejection the fence had last advanced, from the rejection's
DETAIL (``late_ms``). It tells a paused writer (lateness near the lease TTL or above) from a
race (milliseconds). Row fences keep no time per row: ``None``.

These count what *this process* saw. The database's ``fencekit.rejections`` view counts every
rejection from every client (psql, other services) and survives the rolled-back transaction;
the two agree for this process's rejections, and the view is the one to alert on.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from fencekit.errors import FenceError

__all__ = [
    "MetricEvent",
    "RejectionCount",
    "add_listener",
    "counts",
    "enable_opentelemetry",
    "enable_prometheus",
    "lateness_of",
    "record_rejection",
    "record_unfenced",
    "rejections",
    "remove_listener",
    "reset",
]

Kind = Literal["rejected", "unfenced"]


@dataclass(frozen=True)
class MetricEvent:
    """One client-side observation. ``reason`` is the rejection reason, or ``"unfenced"``."""

    kind: Kind
    table: str
    reason: str
    sqlstate: str | None = None
    error: FenceError | None = None
    #: Seconds since the fence last advanced (stale or reused token on a key or table fence),
    #: else None. What it says about the writer: docs/errors-and-metrics.md, "Lateness".
    lateness: float | None = None


Listener = Callable[[MetricEvent], None]

_lock = threading.Lock()
_tally: Counter[tuple[Kind, str, str]] = Counter()
_listeners: list[Listener] = []
_UNKNOWN_TABLE = "unknown"


def add_listener(listener: Listener) -> Callable[[], None]:
    """Call ``listener(event)`` for every event; returns a function that removes it.

    Listeners run synchronously in the thread that saw the event; one that raises is not
    allowed to hide the database error, so its exception is swallowed.
    """
    with _lock:
        _listeners.append(listener)
    return lambda: remove_listener(listener)


def remove_listener(listener: Listener) -> None:
    with _lock:
        if listener in _listeners:
            _listeners.remove(listener)


def _emit(event: MetricEvent) -> None:
    with _lock:
        _tally[(event.kind, event.table, event.reason)] += 1
        listeners = list(_listeners)
    for listener in listeners:
        try:
            listener(event)
        except Exception:  # noqa: S112 - a metrics sink must never mask the real error
            continue


def lateness_of(error: FenceError) -> float | None:
    """The rejection's lateness in seconds (``late_ms`` in its DETAIL), or None."""
    late = error.detail.get("late_ms")
    if isinstance(late, bool) or not isinstance(late, (int, float)):
        return None
    return float(late) / 1000.0


_COUNTED = "_fencekit_counted"  # set on an error once it has been recorded


def record_rejection(error: FenceError) -> None:
    """Record ``error``, once: the layers it passes through (a fenced cursor, then SQLAlchemy's
    error hook) may each see the same error object."""
    if getattr(error, _COUNTED, False):
        return
    setattr(error, _COUNTED, True)
    _emit(
        MetricEvent(
            "rejected",
            error.table or _UNKNOWN_TABLE,
            error.reason,
            error.sqlstate,
            error,
            lateness_of(error),
        )
    )


def record_unfenced(table: str | None) -> None:
    _emit(MetricEvent("unfenced", table or _UNKNOWN_TABLE, "unfenced"))


@dataclass(frozen=True)
class RejectionCount:
    """One row of the database's ``fencekit.rejections`` view."""

    #: Schema-qualified (``public.billing_summary``): the name FenceError.table and MetricEvent
    #: carry, and ``fencekit status`` shows, so the three line up.
    table: str
    reason: str
    count: int
    last_rejected_at: Any = None  # datetime of the table's last rejection, any reason
    max_token_gap: int | None = None


def rejections(conn: Any) -> list[RejectionCount]:
    """Every client's rejections, by table and reason, from the database (``fencekit.rejections``,
    readable by everyone): what survives the rolled-back transactions. ``conn`` is a psycopg
    connection. Rows with a count of zero are left out."""
    rows = conn.execute(
        "SELECT schema_name, table_name, reason, count, last_rejected_at, max_token_gap "
        "FROM fencekit.rejections WHERE count > 0 ORDER BY schema_name, table_name, reason"
    ).fetchall()
    return [
        RejectionCount(f"{schema}.{name}", reason, int(count), last, gap)
        for schema, name, reason, count, last, gap in rows
    ]


def counts() -> dict[tuple[Kind, str, str], int]:
    """``{(kind, table, reason): n}`` since start or the last :func:`reset`."""
    with _lock:
        return dict(_tally)


def reset() -> None:
    with _lock:
        _tally.clear()


# ---------------------------------------------------------------- backends (lazy imports)


def enable_prometheus(registry: Any = None, *, prefix: str = "fencekit_client") -> Listener:
    """Export counters through prometheus-client (extra ``pg-fencekit[prometheus]``).

    ``<prefix>_rejected_writes_total{table,reason}``, ``<prefix>_unfenced_writes_total{table}``
    and the histogram ``<prefix>_rejection_lateness_seconds{table}`` (rejections that carry a
    lateness) in ``registry`` (default: prometheus-client's global one). Returns the listener.
    """
    try:
        import prometheus_client
    except ImportError as exc:
        raise ImportError(
            "enable_prometheus() needs prometheus-client: pip install 'pg-fencekit[prometheus]'"
        ) from exc
    kwargs: dict[str, Any] = {} if registry is None else {"registry": registry}
    rejected = prometheus_client.Counter(
        f"{prefix}_rejected_writes",
        "Writes PostgreSQL rejected because of their fencing token, seen by this process",
        ["table", "reason"],
        **kwargs,
    )
    unfenced = prometheus_client.Counter(
        f"{prefix}_unfenced_writes",
        "Writes this process sent without a fencing token",
        ["table"],
        **kwargs,
    )
    lateness = prometheus_client.Histogram(
        f"{prefix}_rejection_lateness_seconds",
        "Seconds since the fence had last advanced when it rejected this process's token",
        ["table"],
        buckets=(0.01, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900, 3600),
        **kwargs,
    )

    def listener(event: MetricEvent) -> None:
        if event.kind == "rejected":
            rejected.labels(table=event.table, reason=event.reason).inc()
            if event.lateness is not None:
                lateness.labels(table=event.table).observe(event.lateness)
        else:
            unfenced.labels(table=event.table).inc()

    add_listener(listener)
    return listener


def enable_opentelemetry(meter: Any = None, *, prefix: str = "fencekit.client") -> Listener:
    """Export counters through the OpenTelemetry metrics API (extra ``pg-fencekit[otel]``).

    ``<prefix>.rejected_writes`` and ``<prefix>.unfenced_writes`` with attributes ``table`` and
    ``reason``, and the histogram ``<prefix>.rejection_lateness`` (seconds, attribute
    ``table``), on ``meter`` (default: ``metrics.get_meter("fencekit")``). Returns the
    listener.
    """
    try:
        from opentelemetry import metrics as otel_metrics
    except ImportError as exc:
        raise ImportError(
            "enable_opentelemetry() needs opentelemetry-api: pip install 'pg-fencekit[otel]'"
        ) from exc
    meter = meter or otel_metrics.get_meter("fencekit")
    rejected = meter.create_counter(
        f"{prefix}.rejected_writes", unit="1", description="fencing rejections seen by this process"
    )
    unfenced = meter.create_counter(
        f"{prefix}.unfenced_writes", unit="1", description="writes sent without a fencing token"
    )
    lateness = meter.create_histogram(
        f"{prefix}.rejection_lateness",
        unit="s",
        description="seconds since the fence had last advanced when it rejected a token",
    )

    def listener(event: MetricEvent) -> None:
        counter = rejected if event.kind == "rejected" else unfenced
        counter.add(1, {"table": event.table, "reason": event.reason})
        if event.lateness is not None:
            lateness.record(event.lateness, {"table": event.table})

    add_listener(listener)
    return listener
