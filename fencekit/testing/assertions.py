"""Assertions that read the database, and the failure report they print.

Counters are read from ``fencekit.rejections`` by the table's qualified name, as errors
(``FenceError.table``), client metrics and ``fencekit status`` print it: ``public.billing_summary``
(or ``billing_summary``, in schema ``public``). A failed assertion prints what a person needs to
see: the table's fence, fencekit's counters, the last rejections the workers' clients saw, and
the workers' output.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from fencekit.errors import FencingAssertionError
from fencekit.spec import TableName

if TYPE_CHECKING:
    from fencekit.testing.database import FencedDatabase

__all__ = [
    "assert_fence",
    "assert_no_rejections",
    "assert_rejections",
    "current_database",
    "describe",
    "pop_current_database",
    "push_current_database",
]

_current: list[FencedDatabase] = []


def push_current_database(db: FencedDatabase) -> None:
    """Make ``db`` the database the module-level assertions read (the fixtures do this; the
    innermost fixture wins: a per-test database over a per-session one)."""
    _current.append(db)


def pop_current_database(db: FencedDatabase) -> None:
    if db in _current:
        _current.remove(db)


def current_database() -> FencedDatabase:
    if not _current:
        raise RuntimeError(
            "no fenced database in this test: request the `fenced_db` fixture (or one made "
            "with pytest_fencekit.fenced_database), or pass db="
        )
    return _current[-1]


def describe(db: FencedDatabase, tables: list[str] | None = None, *, lines: int = 25) -> str:
    """The report printed by a failed assertion: fences, counters, rejections, worker output."""
    out: list[str] = []
    names = tables if tables is not None else [s.table.dotted for s in db.specs]
    out.append("fences:")
    if not db.specs:
        out.append("  none: no table in this database is protected by fencekit")
    for spec in db.specs:
        key = f" on ({', '.join(spec.key)})" if spec.key else ""
        out.append(
            f"  {spec.table.dotted}: {spec.scope.value} fence{key}, resource "
            f"{spec.resource_name}, highest token accepted {db.fence(spec.table.dotted)}"
        )
    for table in names:
        found = db.spec_of(table)
        if found is None:
            out.append(f"  {TableName.parse(table).dotted}: NOT PROTECTED (no fence at all)")
            continue
        counts = {r: n for r, n in db.rejections(table).items() if n}
        shown = ", ".join(f"{r}={n}" for r, n in sorted(counts.items())) or "none"
        out.append(f"rejections counted by fencekit on {found.table.dotted}: {shown}")
    seen = [(w, e) for w in db.workers for e in w.rejections]
    out.append("last rejections seen by the workers' clients:")
    if not seen:
        out.append("  none")
    for w, e in seen[-8:]:
        late = "" if e.get("lateness") is None else f", {e['lateness']:.2f}s after the fence moved"
        out.append(
            f"  worker {w.name}: {e['reason']} on {e['table']} key {e.get('key')}: token "
            f"{e.get('token')} against fence {e.get('fence')}{late}"
        )
    for w in db.workers:
        out.append(f"worker {w.name}: {w.describe_end()}; checkpoints {w.checkpoints}")
        out.append(w.output_tail(lines))
    return "\n".join(out)


def _db(db: FencedDatabase | None) -> FencedDatabase:
    return db if db is not None else current_database()


def assert_rejections(
    table: str, *, db: FencedDatabase | None = None, since: Mapping[str, int] | None = None,
    **expected: int,
) -> dict[str, int]:  # fmt: skip
    """Assert fencekit counted exactly these rejections on ``table`` (``stale=1``,
    ``missing=0``...); reasons not named are not checked. ``since``: counts taken earlier
    (``db.rejections(table)``), to assert on what happened after. Returns the counts."""
    __tracebackhide__ = True  # pytest: the failure is the message, not the kit's frames
    d = _db(db)
    if d.spec_of(table) is None:
        raise FencingAssertionError(
            f"{TableName.parse(table).dotted} is not protected by fencekit in this database, so "
            f"nothing is counted there\n{describe(d, [table])}"
        )
    counts = d.rejections(table)
    unknown = sorted(set(expected) - set(counts))
    if unknown:
        raise ValueError(f"unknown rejection reason(s) {unknown}; fencekit counts {sorted(counts)}")
    base = since or {}
    got = {r: counts[r] - base.get(r, 0) for r in counts}
    wrong = {r: (n, got[r]) for r, n in expected.items() if got[r] != n}
    if wrong:
        what = "; ".join(f"{r}: expected {n}, counted {g}" for r, (n, g) in sorted(wrong.items()))
        raise FencingAssertionError(
            f"rejections on {TableName.parse(table).dotted}: {what}\n{describe(d, [table])}"
        )
    return got


def assert_no_rejections(table: str, *, db: FencedDatabase | None = None) -> None:
    """Assert fencekit rejected nothing on ``table``."""
    __tracebackhide__ = True  # pytest: the failure is the message, not the kit's frames
    d = _db(db)
    zero: dict[str, int] = dict.fromkeys(d.rejections(table), 0)
    assert_rejections(table, db=d, since=None, **zero)


def assert_fence(table: str, *, at_least: int, db: FencedDatabase | None = None) -> int:
    """Assert ``table`` has accepted a token of at least ``at_least``; returns its fence."""
    __tracebackhide__ = True  # pytest: the failure is the message, not the kit's frames
    d = _db(db)
    fence = d.fence(table)
    if fence is None or fence < at_least:
        raise FencingAssertionError(
            f"the fence of {TableName.parse(table).dotted} is {fence}, expected at least "
            f"{at_least}\n{describe(d, [table])}"
        )
    return fence
