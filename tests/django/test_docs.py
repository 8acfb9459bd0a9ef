"""The ```python blocks of docs/django.md run, in order, against the test project.

The page imports the models as ``shop.models``, as a project whose app is called ``shop`` would;
here that name is the test project's app.
"""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

import tests.django.shop
import tests.django.shop.models

PAGE = Path(__file__).resolve().parents[2] / "docs" / "django.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


@pytest.mark.django_db(transaction=True)
def test_the_django_page_examples_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "shop", tests.django.shop)
    monkeypatch.setitem(sys.modules, "shop.models", tests.django.shop.models)
    blocks = BLOCK.findall(PAGE.read_text())
    assert len(blocks) >= 3
    namespace: dict[str, object] = {"__name__": "docs"}
    for number, code in enumerate(blocks, 1):
        try:
            exec(
                compile(code, f"docs/django.md block {number}", "exec", dont_inherit=True),
                namespace,
            )  # noqa: S102
        except Exception as exc:
            raise AssertionError(f"docs/django.md, python block {number} failed: {exc!r}") from exc
    # The async example's ORM calls ran on asgiref's thread: close that thread's connection.
    asyncio.run(sync_to_async(connections.close_all)())


def test_the_page_shows_the_test_project_models() -> None:
    page = PAGE.read_text()
    models = Path(tests.django.shop.models.__file__).read_text()
    for line in ('fence = Fence(scope="key", key=["account"])', "fence = Fence()"):
        assert line in page
        assert line in models


def test_the_page_shows_the_django_examples_takeover_test() -> None:
    # The example's own test (run by tests/testing_kit/test_example_django.py), as the page shows
    # it: the whole file after its docstring.
    example = PAGE.parents[0] / "examples" / "billing_django" / "tests" / "test_takeover.py"
    body = example.read_text().split('"""', 2)[2].lstrip("\n")
    assert f"# tests/test_takeover.py\n{body}```" in PAGE.read_text()
