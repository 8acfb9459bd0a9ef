"""The one shape every benchmark reports: a side-by-side ratio."""

from __future__ import annotations

import statistics
from typing import Any

__all__ = ["ratio_result", "server_cpu_ns"]


def ratio_result(
    name: str, base: list[float], fenced: list[float], unit: str, target: str, **extra: Any
) -> dict[str, Any]:
    """Medians of both sides and the median of the per-round ratios (fenced / baseline).

    Each round measures both sides back to back; the median of the per-round ratios cancels the
    slow drifts of a shared machine better than a ratio of overall medians.
    """
    ratios = [f / b for b, f in zip(base, fenced, strict=True)]
    return {
        "name": name,
        "baseline": statistics.median(base),
        "fenced": statistics.median(fenced),
        "ratio": statistics.median(ratios),
        "unit": unit,
        "target": target,
        **extra,
    }


def server_cpu_ns(pid: int) -> int:
    """CPU time the server process ``pid`` (a backend) has run, in nanoseconds; 0 when the
    server is not on this machine or its process is not readable."""
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0
