"""The chaos report in a real browser: Debian's headless Chromium loads it, plotly draws the
timeline, and the page logs nothing to the console (an uncaught error or a console.error would
show as a CONSOLE line on Chromium's log)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from fencekit.chaos.checker import check
from fencekit.chaos.report import FAULT_SYMBOLS, write_html
from tests.chaos.report_history import history
from tests.lab import IN_CI

# Debian's chromium, not a pip package: left out of the fast tier (tests/fast_tier.py).
pytestmark = [pytest.mark.server, pytest.mark.system]

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000", "--window-size=900,900",
    "--dump-dom",
]  # fmt: skip
# Appended to a copy of the report: measures the checker's text after layout, into the DOM.
PROBE = (
    "<script>window.addEventListener('load', () => { const pre = "
    "document.querySelector('pre.checker'); document.body.dataset.checkerFits = "
    "String(pre.scrollWidth <= pre.clientWidth); });</script>"
)


@pytest.fixture(scope="module")
def chromium() -> str:
    binary = shutil.which("chromium")
    if binary is None:
        reason = "headless Chromium is missing: apt-get install chromium (scripts/_system.sh)"
        if IN_CI:
            pytest.fail(reason)
        pytest.skip(reason)
    return binary


def load(chromium: str, page: Path, profile: Path) -> tuple[str, list[str]]:
    """The page's DOM after its scripts ran, and what it logged to the console."""
    run = subprocess.run(
        [chromium, *FLAGS, f"--user-data-dir={profile}", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    console = [line for line in run.stderr.splitlines() if ":CONSOLE" in line]
    return run.stdout, console


def legend(dom: str) -> dict[str, str]:
    """Each legend entry's text and the path of its marker (its symbol, as drawn)."""
    out = {}
    for chunk in dom.split('class="traces"')[1:]:
        name = re.search(r'data-unformatted="([^"]*)"', chunk)
        path = re.search(r'<path[^>]*\bd="([^"]*)"', chunk)
        assert name is not None
        assert path is not None
        out[name.group(1)] = path.group(1)
    return out


def test_the_report_renders_in_chromium_without_console_errors(
    chromium: str, tmp_path: Path
) -> None:
    events = history()
    report = check(events)
    page = tmp_path / "run.html"
    write_html(events, report, page, title="fencekit chaos: a small history")
    page.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    dom, console = load(chromium, page, tmp_path / "profile")
    assert console == [], console
    assert dom.count('class="main-svg"') >= 1  # plotly drew the figure
    assert 'data-checker-fits="true"' in dom  # the checker's text wraps at 900 px
    assert dom.count("<h1") == 1
    assert 'class="gtitle"' not in dom  # no second title inside the plot
    assert "How to read this" in dom
    marks = legend(dom)
    assert {
        "worker paused (1)",
        "write accepted (2)",
        "write rejected: stale (1)",
        "write rejected: missing (1)",
        "write rejected: reused (1)",
        "write connection error (1)",
        "write indeterminate (committed) (1)",
    } <= set(marks)
    assert {f"fault: {kind} (1)" for kind in FAULT_SYMBOLS} <= set(marks)
    # One symbol per rejection reason and per fault kind (and none shared with another mark).
    writes_and_faults = [d for name, d in marks.items() if name.startswith(("write", "fault"))]
    assert len(set(writes_and_faults)) == len(writes_and_faults)
    # The pause is drawn over the paused worker's lease, hatched: one pattern in the page.
    assert "<pattern" in dom
    # Connection errors are counted apart from the fence's rejections.
    assert "<td>rejected by the fence</td><td>3 (missing 1, reused 1, stale 1)</td>" in dom
    assert "<td>connection errors (no verdict: not rejections)</td><td>1</td>" in dom


def test_a_console_error_is_seen(chromium: str, tmp_path: Path) -> None:
    page = tmp_path / "broken.html"
    page.write_text(
        "<!doctype html><html><body><p>x</p>"
        "<script>console.error('logged'); throw new Error('boom');</script></body></html>"
    )
    _, console = load(chromium, page, tmp_path / "profile")
    assert any("logged" in line for line in console), console
    assert any("Uncaught Error: boom" in line for line in console), console
