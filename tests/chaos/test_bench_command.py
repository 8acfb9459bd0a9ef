"""``fencekit bench``: the command runs, prints one ratio table, and reports in JSON.

No timed asserts: the numbers depend on the machine; only their shape is checked.
"""

from __future__ import annotations

import json

import pytest

from fencekit.bench.report import Report, format_ratios, run_all, to_markdown
from fencekit.cli import main


@pytest.mark.slow
@pytest.mark.bench
def test_bench_quick_core_prints_ratios(capsys, pg_dsn) -> None:
    code = main(["bench", "--quick", "--only", "core", "--json", "--dsn", pg_dsn])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    results = report["results"]["core"]
    assert len(results) >= 3
    for r in results:
        assert {"name", "baseline", "fenced", "ratio", "unit", "target"} <= set(r)
        assert r["baseline"] > 0
        assert r["fenced"] > 0
        assert r["ratio"] > 0
    assert "[core" in captured.err  # progress lines on stderr


def test_unknown_group_is_a_usage_error(capsys) -> None:
    assert main(["bench", "--only", "core,nope"]) == 2
    assert "nope" in capsys.readouterr().err


def test_missing_and_failing_modules_are_reported_not_fatal(monkeypatch) -> None:
    import sys
    import types

    broken = types.ModuleType("fencekit.bench.scaling")

    def run(dsn, *, quick, progress):
        raise RuntimeError("boom")

    broken.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fencekit.bench.scaling", broken)
    monkeypatch.setitem(sys.modules, "fencekit.bench.leases", None)  # import fails
    report = run_all("unused", ["scaling", "leases"], quick=True, progress=lambda _: None)
    assert any("scaling: FAILED: RuntimeError: boom" in n for n in report.notes)
    assert any(n.startswith("leases: skipped") for n in report.notes)


def test_tables_render_text_and_markdown() -> None:
    report = Report(
        results={
            "core": [
                {"name": "x", "baseline": 0.002, "fenced": 0.0025, "ratio": 1.25,
                 "unit": "s", "target": "<= 1.3x"},
                {"name": "y", "baseline": 900.0, "fenced": 850.0, "ratio": 0.94,
                 "unit": "tx/s", "target": ">= 0.95x"},
            ]
        }
    )  # fmt: skip
    text = format_ratios(report)
    assert "2 ms" in text
    assert "1.25x" in text
    assert "900" in text
    md = to_markdown(report, scaling=False)
    assert md.splitlines()[0].startswith("| group | benchmark |")
    assert "| core | y | 900 | 850 | 0.94x | >= 0.95x | tx/s |" in md
