"""The drift kinds ``fencekit status --json`` promises are :class:`fencekit.catalog.DriftKind`,
and the DBA guide's table lists exactly those (no server needed)."""

from __future__ import annotations

import re
from pathlib import Path

from fencekit.catalog import DriftKind

GUIDE = Path(__file__).parents[2] / "docs" / "dba-guide.md"


def _guide_kinds() -> set[str]:
    text = GUIDE.read_text(encoding="utf-8")
    section = text.split("## Status and drift", 1)[1].split("\n## ", 1)[0]
    kinds: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            first = line.split("|")[1]
            kinds.update(re.findall(r"`([a-z_]+)`", first))
    return kinds


def test_the_dba_guide_lists_every_drift_kind_and_no_other() -> None:
    assert _guide_kinds() == {k.value for k in DriftKind}


def test_drift_kinds_are_their_json_strings() -> None:
    for k in DriftKind:
        assert k == k.value
        assert str(k) == k.value
        assert re.fullmatch(r"[a-z_]+", k.value)


def test_the_catalog_writes_no_command_lines() -> None:
    """Commands a fix names are catalog.Command values; only the CLI spells them out."""
    root = Path(__file__).parents[2] / "fencekit" / "catalog"
    for path in sorted(root.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert "DSN" not in text, path
        assert not re.search(r"--[a-z]", text), path
