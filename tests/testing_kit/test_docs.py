"""docs/testing-your-workers.md: its test files pass in a copy of the billing example (run by
pytester, as a user runs them), its Django test in a copy of the Django billing example, its
other ```python blocks run, and the takeover tests are under 30 and 20 lines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "testing-your-workers.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
TEST_FILE = re.compile(r"# (tests/test_\w+\.py)\n")
DJANGO_TEST_FILE = re.compile(r"# billing_django/(tests/test_\w+\.py)\n")

pytestmark = pytest.mark.multiproc


def blocks() -> list[str]:
    return BLOCK.findall(PAGE.read_text())


def test_the_takeover_test_is_under_30_lines() -> None:
    takeover = next(b for b in blocks() if "takeover(" in b and "def test_" in b)
    assert len(takeover.strip().splitlines()) < 30


def test_the_django_takeover_test_is_under_20_lines() -> None:
    django = next(b for b in blocks() if DJANGO_TEST_FILE.match(b))
    assert len(django.strip().splitlines()) < 20


def test_the_other_blocks_run() -> None:
    others = [b for b in blocks() if not TEST_FILE.match(b) and not DJANGO_TEST_FILE.match(b)]
    assert others
    for number, code in enumerate(others, 1):
        exec(compile(code, f"{PAGE.name} block {number}", "exec", dont_inherit=True), {})  # noqa: S102


def test_the_page_tests_pass(example: pytest.Pytester) -> None:
    files = {}
    for code in blocks():
        m = TEST_FILE.match(code)
        if m:
            files[m.group(1)] = code
    assert len(files) == 5, sorted(files)
    for path, code in files.items():
        (example.path / path).write_text(code)
    result = example.runpytest_subprocess("-p", "no:randomly", *files, timeout=900)
    result.assert_outcomes(passed=len(files))


def test_the_django_section_passes(django_example: pytest.Pytester) -> None:
    files = {}
    for code in blocks():
        m = DJANGO_TEST_FILE.match(code)
        if m:
            files[m.group(1)] = code
    assert len(files) == 1, sorted(files)
    for path, code in files.items():
        (django_example.path / path).write_text(code)
    result = django_example.runpytest_subprocess("-p", "no:randomly", *files, timeout=600)
    result.assert_outcomes(passed=len(files))
