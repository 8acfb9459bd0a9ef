"""docs/tasks.md shows the recipes' code as the tests run it: every ```python block names its
file on its first line and appears in that file verbatim."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```python\n# (\S+)\n(.*?)^```", re.DOTALL | re.MULTILINE)


def test_the_page_shows_the_tested_recipes() -> None:
    page = (ROOT / "docs" / "tasks.md").read_text()
    blocks = BLOCK.findall(page)
    assert {path for path, _ in blocks} >= {
        "tests/tasks/recipes/billing.py",
        "tests/tasks/recipes/procrastinate_app.py",
        "tests/tasks/recipes/celery_app.py",
        "tests/tasks/recipes/dramatiq_app.py",
        "tests/tasks/recipes/jobqueue.py",
    }
    assert page.count("```python") == len(blocks), "a python block does not name its file"
    for path, code in blocks:
        source = (ROOT / path).read_text()
        assert code in source, f"docs/tasks.md shows code that {path} does not have:\n{code}"
