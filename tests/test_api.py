"""docs/api.md is the supported API: per public module, exactly that module's ``__all__``; every
other module is internal (named by the page's "Internal modules" section)."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import fencekit

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")


def _sections() -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    for block in re.split(r"^## ", PAGE, flags=re.M)[1:]:
        heading = re.match(r"`([\w.]+)`", block)
        if heading:
            sections[heading.group(1)] = re.findall(r"^- `(\w+)`$", block, flags=re.M)
    return sections


SECTIONS = _sections()


@pytest.mark.parametrize("module", sorted(SECTIONS))
def test_the_page_lists_exactly_what_the_module_exports(module: str) -> None:
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:  # an integration whose extra is not installed here
        pytest.skip(f"{module}: {exc}")
    assert sorted(SECTIONS[module]) == sorted(mod.__all__)
    for name in mod.__all__:
        assert hasattr(mod, name), f"{module}.{name} is in __all__ but does not exist"


def test_every_module_is_public_or_internal() -> None:
    internal = PAGE[PAGE.index("## Internal modules") :]
    for info in pkgutil.walk_packages(fencekit.__path__, "fencekit."):
        name = info.name
        if name in SECTIONS or any(part.startswith("_") for part in name.split(".")):
            continue
        # Named on the page itself, or under a package the page names with `.*`.
        parents = [name.rsplit(".", i)[0] for i in range(name.count("."))]
        assert (
            f"`{name}`" in internal
            or any(f"`{p}.*`" in internal for p in parents)
            or any(f"`{p}`" in internal for p in parents[1:])
        ), f"{name}: neither listed as public nor as internal in docs/api.md"
