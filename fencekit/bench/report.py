"""Run every benchmark module that exists and print one table of ratios plus the scaling table.

Benchmark modules (``fencekit.bench.<group>``) share one contract:
``run(dsn, *, quick, progress) -> list[dict]`` with keys name, baseline, fenced, ratio, unit,
target. A module that is not there (or whose optional dependency is missing) is skipped and
named in the notes; a module that fails is reported too, and the others still run.
"""

from __future__ import annotations

import importlib
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["GROUPS", "Report", "format_ratios", "format_scaling", "run_all", "to_markdown"]

GROUPS = ("core", "adapters", "leases", "rollout", "scaling")
Progress = Callable[[str], None]


@dataclass
class Report:
    results: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"results": self.results, "notes": self.notes, "seconds": self.seconds}


def run_all(dsn: str, groups: list[str], *, quick: bool, progress: Progress) -> Report:
    report = Report()
    for group in groups:
        try:
            module = importlib.import_module(f"fencekit.bench.{group}")
        except ModuleNotFoundError as exc:
            report.notes.append(f"{group}: skipped (module {exc.name} is not installed)")
            continue
        started = time.monotonic()

        def tagged(text: str, group: str = group, started: float = started) -> None:
            progress(f"[{group} {time.monotonic() - started:5.1f}s] {text}")

        tagged("starting")
        try:
            report.results[group] = list(module.run(dsn, quick=quick, progress=tagged))
        except Exception as exc:  # one broken benchmark must not hide the others' results
            report.notes.append(f"{group}: FAILED: {type(exc).__name__}: {exc}")
            tagged(traceback.format_exc())
        report.seconds[group] = time.monotonic() - started
    return report


def _num(value: float, unit: str) -> str:
    if unit.startswith("s"):
        scaled, suffix = value * 1e6, "µs"
        if scaled >= 1000:
            scaled, suffix = scaled / 1000, "ms"
        return f"{scaled:.3g} {suffix}"
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _rows(report: Report, scaling: bool) -> list[list[str]]:
    rows = []
    for group, results in report.results.items():
        if (group == "scaling") != scaling:
            continue
        for r in results:
            unit = str(r.get("unit", ""))
            rows.append([
                group,
                str(r["name"]),
                _num(float(r["baseline"]), unit),
                _num(float(r["fenced"]), unit),
                f"{float(r['ratio']):.2f}x",
                str(r.get("target", "")),
                unit,
            ])  # fmt: skip
    return rows


_HEAD = ["group", "benchmark", "baseline", "fenced", "ratio", "target", "unit"]


def _text_table(rows: list[list[str]]) -> str:
    if not rows:
        return "  (no results)"
    widths = [max(len(r[i]) for r in [_HEAD, *rows]) for i in range(len(_HEAD))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(_HEAD, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def format_ratios(report: Report) -> str:
    return _text_table(_rows(report, scaling=False))


def format_scaling(report: Report) -> str:
    return _text_table(_rows(report, scaling=True))


def to_markdown(report: Report, *, scaling: bool) -> str:
    """The same table as Markdown, for docs/performance.md."""
    rows = _rows(report, scaling=scaling)
    out = ["| " + " | ".join(_HEAD) + " |", "|" + "---|" * len(_HEAD)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)
