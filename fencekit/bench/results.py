"""The one shape every benchmark reports: a side-by-side ratio."""

from __future__ import annotations

import statistics
from typing import Any

__all__ = ["ratio_result"]


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
