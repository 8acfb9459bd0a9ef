"""The statement check: once per statement, before any row (key fences: before TRUNCATE only).

It refuses what is wrong whatever the rows: a malformed token, a bypass asked for by a role that
may not, a token from another issuer, TRUNCATE under a token lower than the fence, a missing
token under ``on_missing = reject``. Row fences judge each write again on their own (a
statement can change the token after this ran); a table fence is judged here, once, because
the whole table is its resource; a key fence is judged after the statement (key.py).
"""

from __future__ import annotations

from fencekit.spec import Scope
from fencekit.sqlgen.common import Names, definer_function, issuer_check, validate_token
from fencekit.sqlgen.objects import Function, Trigger
from fencekit.sqlgen.table import table_fence
from fencekit.sqlgen.text import TOKEN, TOKEN_FAST, lit

__all__ = ["statement_objects"]


def _fast_path(n: Names) -> str:
    """One expression that ends the common case: a well-formed token, no bypass, the right
    issuer. Table fences never take it: every statement advances their fence; nor key fences,
    whose statement check runs for TRUNCATE only."""
    if n.spec.scope is not Scope.ROW:
        return ""
    issuer = ""
    if n.spec.issuer is not None:
        issuer = (
            "\n     AND (COALESCE(pg_catalog.current_setting('fencekit.issuer', true), '') "
            "OPERATOR(pg_catalog.=) ''\n"
            "          OR pg_catalog.current_setting('fencekit.issuer', true) "
            f"OPERATOR(pg_catalog.=) {lit(n.spec.issuer)})"
        )
    return (
        f"  IF {TOKEN} OPERATOR(pg_catalog.~) {TOKEN_FAST}\n"
        "     AND COALESCE(pg_catalog.current_setting('fencekit.bypass', true), '') "
        "OPERATOR(pg_catalog.=) ''"
        f"{issuer} THEN\n"
        "    RETURN NULL;\n"
        "  END IF;\n"
    )


def _missing(n: Names) -> str:
    """No token: bypass, on_missing=allow, or YF003. ``unfenced_write`` counts an allowed or
    bypassed write once per statement; row and key fences call it again where they write (a
    statement may clear the token after this check), without counting twice."""
    return (
        "  IF tok IS NULL THEN\n"
        f"    PERFORM fencekit.unfenced_write({n.lit_tag}, TG_RELID, TG_NAME, {n.allow});\n"
        "    RETURN NULL;\n"
        "  END IF;\n"
    )


def _truncate(n: Names, *, only: bool) -> str:
    """TRUNCATE writes every row: its token must not be lower than any fence of the table, and
    it advances every fence it passed (a later write under a lower token is stale).

    Row fences: the highest fence column of the table, read by a definer with row_security off
    (the writer's RLS policies must not hide a fence from the check; the column is checked to
    be a plain bigint first, so no cast or operator of the caller's runs); the rows are gone
    afterwards, so there is nothing to advance. Key fences: every fence of the resource and its
    floor are raised to the token (advance_fences with keys NULL). Table fences: the statement
    is judged like any other by table_fence below, which advances the one fence."""
    scope = n.spec.scope
    if scope is Scope.TABLE:
        return ""
    if scope is Scope.ROW:
        t = n.spec.table
        fence = (
            "    IF (SELECT a.atttypid FROM pg_catalog.pg_attribute a\n"
            f"         WHERE a.attrelid OPERATOR(pg_catalog.=) {lit(t.sql)}::pg_catalog.regclass\n"
            f"           AND a.attname OPERATOR(pg_catalog.=) {lit(n.spec.column)}"
            " AND NOT a.attisdropped)\n"
            "       IS DISTINCT FROM 'pg_catalog.int8'::pg_catalog.regtype THEN\n"
            f"      PERFORM fencekit.reject('usage', {n.lit_tag}, TG_RELID, TG_NAME, "
            f"{lit(n.spec.column)}, NULL, NULL, tok,\n"
            "        NULL, 'the fence column is no longer a bigint; protect the table again');\n"
            "    END IF;\n"
            f"    SELECT pg_catalog.max({n.col}) INTO fence FROM {t.sql};\n"
        )
        judge = (
            "    IF fence OPERATOR(pg_catalog.>) tok THEN\n"
            "      IF NOT byp THEN\n"
            f"        PERFORM fencekit.reject('stale', {n.lit_tag}, TG_RELID, TG_NAME, NULL, "
            "NULL, NULL, tok,\n"
            "                                fence);\n"
            "      END IF;\n"
            f"      PERFORM fencekit.count_event({n.lit_tag}, TG_RELID, 'bypassed');\n"
            "    END IF;\n"
        )
    else:
        fence = (
            "    SELECT * INTO bad FROM fencekit.advance_fences("
            f"{n.resource}, NULL, tok, {lit(n.spec.on_equal)});\n"
        )
        judge = (
            "    IF bad.bad_reason IS NOT NULL AND NOT byp THEN\n"
            f"      PERFORM fencekit.reject(bad.bad_reason, {n.lit_tag}, TG_RELID, TG_NAME, NULL, "
            f"{n.resource}, NULL,\n"
            "                              tok, bad.bad_fence);\n"
            "    ELSIF bad.bad_reason IS NOT NULL THEN\n"
            f"      PERFORM fencekit.count_event({n.lit_tag}, TG_RELID, 'bypassed');\n"
            "    END IF;\n"
        )
    if only:  # the function fires on TRUNCATE alone
        return fence.replace("\n  ", "\n").removeprefix("  ") + judge.replace("\n  ", "\n")[2:]
    return (
        "  IF TG_OP OPERATOR(pg_catalog.=) 'TRUNCATE' THEN\n" + fence + judge + "    RETURN NULL;\n"
        "  END IF;\n"
    )


def _body(n: Names, *, fast: bool = False, truncate: str = "both") -> str:
    """``truncate``: 'both' (the function fires for TRUNCATE and other statements), 'only'
    (TRUNCATE alone) or 'never'."""
    return (
        n.title(f"statement check ({n.spec.scope} fence)") + "DECLARE\n"
        "  raw pg_catalog.text;\n"
        "  tok pg_catalog.int8;\n"
        "  byp pg_catalog.bool;\n"
        "  fence pg_catalog.int8;\n"
        "  bad pg_catalog.record;\n"
        "  lb pg_catalog.record;\n"
        "BEGIN\n"
        + (_fast_path(n) if fast else "")
        + f"  raw := {TOKEN};  -- read once: everything below judges this value\n"
        "  byp := false;\n"
        "  IF COALESCE(pg_catalog.current_setting('fencekit.bypass', true), '') "
        "OPERATOR(pg_catalog.<>) '' THEN\n"
        f"    byp := fencekit.bypass_allowed({n.lit_tag}, TG_RELID, TG_NAME);\n"
        "  END IF;\n"
        "  IF raw OPERATOR(pg_catalog.<>) '' THEN\n"
        + validate_token(n, indent="    ")
        + "    tok := raw::pg_catalog.int8;\n"
        "  END IF;\n"
        + issuer_check(n)
        + _missing(n)
        + ("" if truncate == "never" else _truncate(n, only=truncate == "only"))
        + table_fence(n)
        + "  RETURN NULL;\n"
        "END\n"
    )


def statement_objects(n: Names) -> tuple[list[Function], list[Trigger]]:
    scope = n.spec.scope
    if scope is Scope.ROW:
        # Row fences: the check before INSERT, UPDATE and DELETE runs as the writer (its fast
        # path is every statement's cost); TRUNCATE's reads every fence of the table whatever
        # the writer's RLS policies, so it runs as the role that ran protect, row_security off.
        stmt = n.function("stmt", "\n" + _body(n, fast=True, truncate="never"))
        trunc = definer_function(
            n.function, "trunc", _body(n, truncate="only"), (("row_security", "off"),)
        )
        return [stmt, trunc], [
            Trigger(n.trigger("stmt"), "BEFORE INSERT OR UPDATE OR DELETE", "STATEMENT", stmt),
            Trigger(n.trigger("trunc"), "BEFORE TRUNCATE", "STATEMENT", trunc),
        ]
    # Key and table fences write fencekit.fences: the check runs as the role that ran protect
    # (see objects.Function).
    stmt = definer_function(n.function, "stmt", _body(n), ())
    truncate = Trigger(n.trigger("trunc"), "BEFORE TRUNCATE", "STATEMENT", stmt)
    if scope is Scope.KEY:
        # A key fence judges every INSERT, UPDATE and DELETE after the statement, by the
        # token it reads then (key.py); a check before it would add a call and judge nothing.
        return [stmt], [truncate]
    return [stmt], [
        Trigger(n.trigger("stmt"), "BEFORE INSERT OR UPDATE OR DELETE", "STATEMENT", stmt),
        truncate,
    ]
