"""Key fences: rows that cross partitions, judged one by one where no transition table has them.

PostgreSQL runs an UPDATE that moves a row to another partition as a DELETE from the old
partition and an INSERT into the new one. For an UPDATE statement, it still puts the row in the
UPDATE's transition tables, which the key fence's statement trigger reads (key.py). For MERGE
it does not: the old row goes to the DELETE transition table and the new one to the INSERT
transition table, and their statement triggers fire only when the MERGE has a DELETE or an
INSERT action (PostgreSQL 15 to 18). A MERGE whose only action is UPDATE moved rows that no
key trigger saw: a stale token was accepted.

So a key-fenced partitioned table (no other kind moves rows) has two row triggers more, AFTER
DELETE (the row that leaves) and AFTER INSERT (the row that arrives, with the key its new
partition computed), which judge their row's key (key._row_function). Their WHEN clause lets
them fire only while an UPDATE statement runs on the table (a MERGE with an UPDATE action, and
an INSERT ... ON CONFLICT DO UPDATE, fire the UPDATE statement triggers): a transaction-local
count, ``fencekit.cross_<tag>``, that two statement triggers keep in their own WHEN clauses
(which set it and are never true, so no function runs). A count, not a flag: an UPDATE that
a trigger runs inside another statement sets it back as it was when it ends.

Rows that an UPDATE, a MERGE or an upsert inserts or deletes without moving them are judged
twice, by the row triggers and by their statement's trigger: nothing tells a row a MERGE moved
from one it inserted (a MERGE with an INSERT action shows the moved row to the INSERT trigger
too, but so does an INSERT that runs a MERGE in a trigger). Judging twice changes nothing; it
costs only on a partitioned table, and only in statements that update. Anyone may set the
count; a writer that does skips the row check of its own moved rows, which gains it no more
than presenting a higher token does (docs/security.md).
"""

from __future__ import annotations

from dataclasses import replace

from fencekit.sqlgen.common import Names
from fencekit.sqlgen.objects import Function, Trigger
from fencekit.sqlgen.text import lit

__all__ = ["crossing_triggers"]


def _count(n: Names) -> tuple[str, str]:
    """The count's setting as a literal, and SQL for its value (0 when unset; the count is never
    negative: each UPDATE adds one before it starts and takes it back when it ends)."""
    name = lit(f"fencekit.cross_{n.tag}")
    value = (
        f"pg_catalog.concat('0', pg_catalog.current_setting(\n    {name}, true))::pg_catalog.int4"
    )
    return name, value


def _add(n: Names, delta: int) -> str:
    """A trigger's WHEN clause that adds ``delta`` to the count and is never true."""
    name, value = _count(n)
    op = "+" if delta > 0 else "-"
    return (
        f"pg_catalog.set_config({name},\n"
        f"    ({value}\n      OPERATOR(pg_catalog.{op}) {abs(delta)})::pg_catalog.text, true)"
        " IS NULL"
    )


def crossing_triggers(
    n: Names, out_fn: Function, in_fn: Function, never: Function
) -> list[Trigger]:
    """The row checks of rows crossing partitions (``out_fn`` judges OLD, ``in_fn`` NEW:
    key._row_function) and the statement triggers that keep their count. ``never``: the
    function the counting triggers name (their WHEN is never true)."""
    updating = f"{_count(n)[1]}\n  OPERATOR(pg_catalog.>) 0"
    triggers = [
        Trigger(n.trigger("cross_out"), "AFTER DELETE", "ROW", out_fn, when=updating),
        Trigger(n.trigger("cross_in"), "AFTER INSERT", "ROW", in_fn, when=updating),
        Trigger(n.trigger("upd_begins"), "BEFORE UPDATE", "STATEMENT", never, when=_add(n, 1)),
        Trigger(n.trigger("upd_ends"), "AFTER UPDATE", "STATEMENT", never, when=_add(n, -1)),
    ]
    return [replace(t, partitioned_only=True) for t in triggers]
