"""Table fences: one fence for the whole table, judged once per statement.

The table fence has no objects of its own: it is the statement check's last step, which
passes the resource's one fence (key '') to ``fencekit.judge_fences``: advanced to the
statement's token, share-locked when it already holds it, or the statement rejected. A
statement that changes the token afterwards changes nothing: the whole statement was judged.
"""

from __future__ import annotations

from fencekit.spec import Scope
from fencekit.sqlgen.common import Names, judge_fences

__all__ = ["table_fence"]


def table_fence(n: Names) -> str:
    """PL/pgSQL for the statement check of a table fence (empty for other scopes)."""
    if n.spec.scope is not Scope.TABLE:
        return ""
    return judge_fences(n, "ARRAY['']")
