"""The statement check: once per statement, before any row (key fences: before TRUNCATE only).

It refuses what is wrong whatever the rows: a malformed token, a bypass asked for by a role that
may not, a token from another issuer, a missing token under ``on_missing = reject``
(``fencekit.statement_token``, 45_judge.sql), and TRUNCATE under a token lower than any fence
of the table. A statement let through without a token (allowed or bypassed) is counted here,
once, on every scope. Row fences judge each write again on their own (a statement can change
the token after this ran); a table fence is judged here, once, because the whole table is its
resource; a key fence is judged after the statement (key.py).
"""

from __future__ import annotations

from fencekit.ident import quote_ident
from fencekit.spec import Scope
from fencekit.sqlgen.common import (
    Names,
    attribute,
    definer_function,
    judge_fences,
    statement_token,
)
from fencekit.sqlgen.objects import Function, Trigger
from fencekit.sqlgen.table import table_fence
from fencekit.sqlgen.text import TOKEN, lit, token_fast

__all__ = ["statement_objects"]


def _fast_path(n: Names) -> str:
    """A row fence's common case in one expression, without a call: the token read once and
    left where the row checks read it (``n.checked``, which ``set_config`` returns), well formed,
    no bypass, the right issuer. One expression, because it is every statement's cost and
    PL/pgSQL prepares each expression of a function again in every transaction. Anything else
    goes on."""
    read = f"COALESCE({TOKEN}, '')"
    token = token_fast(
        f"pg_catalog.set_config({n.checked_name},\n       {read}, true)\n      ",
        again=f"\n         pg_catalog.current_setting({n.checked_name})",
        indent="     ",
    )
    # Rollout mode (on_missing = allow): a statement without a token goes on past this, to be
    # counted and attributed to its writer (fencekit.attribute) once, by the check.
    issuer = ""
    if n.spec.issuer is not None:
        issuer = (
            "\n     AND (COALESCE(pg_catalog.current_setting('fencekit.issuer', true), '') "
            "OPERATOR(pg_catalog.=) ''\n"
            "          OR pg_catalog.current_setting('fencekit.issuer', true) "
            f"OPERATOR(pg_catalog.=) {lit(n.spec.issuer)})"
        )
    return (
        "  -- The token, read once and left where the row checks read it (they judge each row\n"
        "  -- by it and refuse a row that reads another). A token is a positive bigint in plain\n"
        "  -- decimal: this settles the ones below 10^18; anything else goes to\n"
        "  -- fencekit.statement_token, which judges the rest.\n"
        f"  IF {token}\n"
        "     AND COALESCE(pg_catalog.current_setting('fencekit.bypass', true), '') "
        f"OPERATOR(pg_catalog.=) ''{issuer} THEN\n"
        "    RETURN NULL;\n"
        "  END IF;\n"
    )


def _row_truncate(n: Names) -> str:
    """TRUNCATE of a row-fenced table: its token must not be lower than any row's fence. The
    function is owned by the table's owner (protect gives it to the owner) and runs as that
    owner with row_security off, so the writer's RLS policies hide no fence and everything of
    the owner's that reading the table runs (index, statistics and partition key expressions
    folded by the planner) runs with the owner's rights only. It reads the truncated table by
    OID (TG_RELID), never by name: after a rename, whatever took the old name is not read.
    check_fence_column refuses a table (or a child) owned by anyone else, and a fence column
    that is no longer a bigint. The rows are gone afterwards: nothing to advance.
    """
    return (
        f"    PERFORM fencekit.check_fence_column({n.lit_tag}, TG_RELID,\n"
        "      TG_NAME::pg_catalog.text, TG_RELID::pg_catalog.regclass,\n"
        f"      {lit(n.spec.column)}::pg_catalog.name);\n"
        "    -- dynamic SQL: the table is the one the trigger fired on, known only at run time\n"
        "    EXECUTE pg_catalog.format('SELECT pg_catalog.max(%I) FROM %s',\n"
        f"                              {lit(n.spec.column)}, TG_RELID::pg_catalog.regclass)\n"
        "      INTO fence;\n"
        f"    PERFORM fencekit.judge_row_truncate({n.lit_tag}, TG_RELID,\n"
        "      TG_NAME::pg_catalog.text, tok, fence);\n"
    )


def statement_objects(n: Names) -> tuple[list[Function], list[Trigger]]:
    scope = n.spec.scope
    title = n.title(f"statement check ({scope} fence)")
    if scope is Scope.ROW:
        # Before INSERT, UPDATE and DELETE: runs as the writer, fast path first. TRUNCATE reads
        # every row's fence: its own function, as the table's owner (see _row_truncate).
        # A statement let through without a token (allowed, or bypassed) is counted here, once,
        # as on key and table fences; its rows are not counted again (row.py).
        if n.spec.on_missing == "allow":
            no_bypass = (
                "COALESCE(pg_catalog.current_setting('fencekit.bypass', true), '') "
                "OPERATOR(pg_catalog.=) ''"
            )
            counter = lit(f"fencekit.{quote_ident(n.tag + ':unfenced')}")
            rest = (
                # Rollout mode, the common tokenless case: count and attribute the statement,
                # once, here. Its rows pass in their row checks' second expression (row.py).
                # The count is fencekit.count_event's, inline, in the test itself: one
                # expression, where a PERFORM would run a query (the protect script that makes
                # this function makes the counter first; the cast is resolved once, when
                # PL/pgSQL plans the line).
                f"  IF (CASE WHEN {n.checked}\n"
                "                  OPERATOR(pg_catalog.=) ''\n"
                f"                AND {no_bypass}\n"
                f"           THEN pg_catalog.nextval({counter}::pg_catalog.regclass) IS NOT NULL\n"
                "           ELSE false END) THEN  -- no token, no bypass: counted\n"
                + attribute(n, otherwise=False)
                + "    RETURN NULL;\n  END IF;\n"
                f"  IF {statement_token(n)} IS NULL THEN\n"
                + attribute(n, otherwise=False)
                + "  END IF;\n"
            )
        else:
            rest = f"  PERFORM {statement_token(n)};\n"
        # The token read once, left where the row checks read it (n.checked): they judge
        # each row by it and refuse a row that reads another (principle: one statement, one
        # token). Nothing runs between this read and fencekit.statement_token's own.
        stmt = n.function(
            "stmt",
            f"\n{title}" + "BEGIN\n" + _fast_path(n) + rest + "  RETURN NULL;\nEND\n",
        )
        trunc = definer_function(
            n.function,
            "trunc",
            f"{title}DECLARE\n  tok pg_catalog.int8 := {statement_token(n)};\n"
            "  fence pg_catalog.int8;\nBEGIN\n"
            "  IF tok IS NOT NULL THEN\n"
            + _row_truncate(n)
            + attribute(n)
            + "  END IF;\n  RETURN NULL;\nEND\n",
            (("row_security", "off"),),
            table_owner=True,
        )
        return [stmt, trunc], [
            Trigger(n.trigger("stmt"), "BEFORE INSERT OR UPDATE OR DELETE", "STATEMENT", stmt),
            Trigger(n.trigger("trunc"), "BEFORE TRUNCATE", "STATEMENT", trunc),
        ]
    # Key and table fences write fencekit.fences (through fencekit.judge_fences): the check runs
    # as the role that ran protect (see objects.Function). A key fence's runs for TRUNCATE only
    # and raises every fence of the resource; a table fence's judges every statement.
    judge = table_fence(n) if scope is Scope.TABLE else judge_fences(n, "NULL")
    stmt = definer_function(
        n.function,
        "stmt",
        f"{title}DECLARE\n  tok pg_catalog.int8 := {statement_token(n)};\nBEGIN\n"
        f"  IF tok IS NOT NULL THEN\n{judge}{attribute(n)}  END IF;\n  RETURN NULL;\nEND\n",
        (),
    )
    truncate = Trigger(n.trigger("trunc"), "BEFORE TRUNCATE", "STATEMENT", stmt)
    if scope is Scope.KEY:
        # A key fence judges every INSERT, UPDATE and DELETE after the statement, by the
        # token it reads then (key.py); a check before it would add a call and judge nothing.
        return [stmt], [truncate]
    return [stmt], [
        Trigger(n.trigger("stmt"), "BEFORE INSERT OR UPDATE OR DELETE", "STATEMENT", stmt),
        truncate,
    ]
