"""Running one entry point of the canary matrix and judging what its canaries recorded."""

from __future__ import annotations

from typing import Any

from tests.security.canary.conftest import Planted


def baseline(planted: Planted) -> dict[str, dict[str, Any]]:
    """What the canaries recorded while the template was built (a fresh copy starts there)."""
    with planted.fresh() as db:
        return planted.hits(db)


def misfires(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> list[str]:
    """Canaries that ran as anyone but the owner or the writer between two readings."""
    out = []
    for label, now in sorted(after.items()):
        was = before.get(label, {}).get("other", 0)
        if now.get("other", 0) > was:
            out.append(
                f"{label} ran {now['other'] - was}x as {now.get('role')} "
                f"(session {now.get('session')})"
            )
    return out


def fired(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> set[str]:
    """Labels that ran at all between two readings."""
    return {
        label
        for label, now in after.items()
        if sum(now.get(p, 0) for p in ("owner", "writer", "other"))
        > sum(before.get(label, {}).get(p, 0) for p in ("owner", "writer", "other"))
    }


class Matrix:
    """Collects every cell's misfires; ``assert_clean`` fails once with all of them."""

    def __init__(self) -> None:
        self.cells = 0
        self.failures: list[str] = []

    def judge(
        self, cell: str, before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]
    ) -> None:
        self.cells += 1
        for m in misfires(before, after):
            self.failures.append(f"{cell}: {m}")

    def assert_clean(self) -> None:
        if self.failures:
            shown = "\n  ".join(self.failures)
            raise AssertionError(
                f"owner code ran with more than the owner's rights in {len(self.failures)} "
                f"places ({self.cells} cells):\n  {shown}"
            )
