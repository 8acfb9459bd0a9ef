"""pg-fencekit and pytest-fencekit are released together: one version, pinned both ways."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def _project(path: Path) -> dict[str, object]:
    project: dict[str, object] = tomllib.loads(path.read_text(encoding="utf-8"))["project"]
    return project


def test_the_two_distributions_pin_each_other_at_one_version() -> None:
    lib = _project(ROOT / "pyproject.toml")
    plugin = _project(ROOT / "pytest-fencekit" / "pyproject.toml")
    assert lib["version"] == plugin["version"]
    assert f"pg-fencekit=={lib['version']}" in plugin["dependencies"]  # type: ignore[operator]
    extras = lib["optional-dependencies"]
    assert extras["testing"] == [f"pytest-fencekit=={lib['version']}"]  # type: ignore[index]


def test_pg_fencekit_registers_no_pytest_plugin_and_publishes_no_dev_tools() -> None:
    lib = _project(ROOT / "pyproject.toml")
    assert "pytest11" not in lib.get("entry-points", {})  # type: ignore[operator]
    published = [r for reqs in lib["optional-dependencies"].values() for r in reqs]  # type: ignore[attr-defined]
    assert not [
        r
        for r in published
        if r.split(">")[0].split("[")[0] in ("ruff", "mypy", "hatchling", "pytest-xdist")
    ]
    assert lib["dependencies"] == ["psycopg>=3.1"]
