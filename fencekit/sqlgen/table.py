"""Table fences: one fence for the whole table, judged once per statement.

The table fence has no objects of its own: it is the statement check's last step, which
advances the resource's fence (key '') to the statement's token or rejects the statement. A
statement that changes the token afterwards changes nothing: the whole statement was judged.
"""

from __future__ import annotations

from fencekit.spec import Scope
from fencekit.sqlgen.common import Names
from fencekit.sqlgen.text import lit

__all__ = ["table_fence"]


def table_fence(n: Names) -> str:
    """PL/pgSQL for the statement check of a table fence (empty for other scopes)."""
    if n.spec.scope is not Scope.TABLE:
        return ""
    lease = ""
    if n.spec.lease_bound:
        lease = (
            f"  SELECT * INTO lb FROM fencekit.lease_mismatch({n.resource}, ARRAY[''], tok);\n"
            "  IF lb.bad_key IS NOT NULL AND NOT byp THEN\n"
            f"    PERFORM fencekit.reject('lease_mismatch', {n.lit_tag}, TG_RELID, TG_NAME, NULL,"
            "\n"
            f"      fencekit.lease_resource({n.resource}, lb.bad_key), NULL, tok, "
            "lb.lease_token);\n"
            "  END IF;\n"
        )
    mine = ""
    if n.spec.on_equal == "reject":
        mine = "\n     AND f.writer_xact OPERATOR(pg_catalog.=) pg_catalog.pg_current_xact_id()"
    # The holder writing again: its fence already holds the token; share-lock it and go on (one
    # key, so locking here keeps the one-order rule). Anything else goes to advance_fences.
    return lease + (
        "  PERFORM FROM fencekit.fences f\n"
        f"   WHERE f.resource OPERATOR(pg_catalog.=) {n.resource} "
        "AND f.key OPERATOR(pg_catalog.=) ''\n"
        f"     AND f.fence OPERATOR(pg_catalog.=) tok{mine}\n"
        "     FOR SHARE;\n"
        "  IF FOUND THEN\n"
        "    RETURN NULL;\n"
        "  END IF;\n"
        "  SELECT * INTO bad FROM fencekit.advance_fences("
        f"{n.resource}, ARRAY[''], tok, {lit(n.spec.on_equal)});\n"
        "  IF bad.bad_reason IS NOT NULL AND NOT byp THEN\n"
        f"    PERFORM fencekit.reject(bad.bad_reason, {n.lit_tag}, TG_RELID, TG_NAME, NULL, "
        f"{n.resource}, NULL,\n"
        "                            tok, bad.bad_fence);\n"
        "  ELSIF bad.bad_reason IS NOT NULL THEN\n"
        f"    PERFORM fencekit.count_event({n.lit_tag}, TG_RELID, 'bypassed');\n"
        "  END IF;\n"
    )
