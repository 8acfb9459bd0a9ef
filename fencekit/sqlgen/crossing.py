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
them fire only once an UPDATE has begun on the table in the transaction (a MERGE with an
UPDATE action, and an INSERT ... ON CONFLICT DO UPDATE, fire the UPDATE statement triggers):
a transaction-local setting, ``fencekit.cross_<tag>``, that a BEFORE UPDATE statement trigger
sets in its own WHEN clause (which is never true, so no function runs). Nothing sets it back:
PostgreSQL fires a BEFORE STATEMENT trigger once per table and query level, but evaluates an
AFTER STATEMENT trigger's WHEN once per write in the query (a writable CTE and its MERGE), so
no count kept by the two matches the statements running.

Rows that a transaction inserts or deletes on the table after it began an UPDATE there are
judged twice, by the row triggers and by their statement's trigger: nothing tells a row a MERGE
moved from one it inserted. Judging twice changes nothing; it costs only on a partitioned
table, in transactions that update it. Anyone may clear the setting; a writer that does skips
the row check of its own moved rows, which gains it no more than presenting a higher token
does (docs/security.md).
"""

from __future__ import annotations

from dataclasses import replace

from fencekit.sqlgen.common import Names
from fencekit.sqlgen.objects import Function, Trigger
from fencekit.sqlgen.text import lit

__all__ = ["crossing_triggers"]


def crossing_triggers(
    n: Names, out_fn: Function, in_fn: Function, never: Function
) -> list[Trigger]:
    """The row checks of rows crossing partitions (``out_fn`` judges OLD, ``in_fn`` NEW:
    key._row_function) and the statement trigger that sets their setting. ``never``: the
    function that trigger names (its WHEN is never true)."""
    name = lit(f"fencekit.cross_{n.tag}")
    updated = f"pg_catalog.current_setting({name}, true)\n  OPERATOR(pg_catalog.=) 'on'"
    triggers = [
        Trigger(n.trigger("cross_out"), "AFTER DELETE", "ROW", out_fn, when=updated),
        Trigger(n.trigger("cross_in"), "AFTER INSERT", "ROW", in_fn, when=updated),
        Trigger(
            n.trigger("updating"),
            "BEFORE UPDATE",
            "STATEMENT",
            never,
            when=f"pg_catalog.set_config(\n    {name}, 'on', true) IS NULL",
        ),
    ]
    return [replace(t, partitioned_only=True) for t in triggers]
