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
    """One expression that ends the common case: a well-formed token (or, under on_missing =
    allow, none), no bypass, the right issuer. Table fences never take it: every statement
    advances their fence; nor key fences, whose statement check runs for TRUNCATE only."""
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
    token = f"{TOKEN} OPERATOR(pg_catalog.~) {TOKEN_FAST}"
    if n.spec.on_missing == "allow":
        # Rollout mode: a statement without a token needs nothing here either; its row
        # triggers judge and count each row it writes (unfenced_write).
        token = f"({token}\n      OR COALESCE({TOKEN}, '') OPERATOR(pg_catalog.=) '')"
    return (
        f"  IF {token}\n"
        "     AND COALESCE(pg_catalog.current_setting('fencekit.bypass', true), '') "
        "OPERATOR(pg_catalog.=) ''"
        f"{issuer}\n"
        "     AND TG_OP OPERATOR(pg_catalog.<>) 'TRUNCATE' THEN\n"
        "    RETURN NULL;\n"
        "  END IF;\n"
    )


def _missing(n: Names) -> str:
    """No token: bypass, on_missing=allow, or YF003. ``unfenced_write`` counts the allowed or
    bypassed write. A row fence's row triggers judge and count each row again (a statement may
    clear the token after this check), so here it counts only a TRUNCATE, which has none."""
    counted = ""
    if n.spec.scope is Scope.ROW:
        counted = ",\n                                    TG_OP OPERATOR(pg_catalog.=) 'TRUNCATE'"
    return (
        "  IF tok IS NULL THEN\n"
        f"    PERFORM fencekit.unfenced_write({n.lit_tag}, TG_RELID, TG_NAME, {n.allow}"
        f"{counted});\n"
        "    RETURN NULL;\n"
        "  END IF;\n"
    )


def _truncate(n: Names) -> str:
    t = n.spec.table
    if n.spec.scope is Scope.ROW:
        fence = f"SELECT pg_catalog.max({n.col}) INTO fence FROM {t.sql}"
    else:
        fence = f"fence := fencekit.max_fence({n.resource})"
    return (
        "  IF TG_OP OPERATOR(pg_catalog.=) 'TRUNCATE' THEN\n"
        f"    {fence};\n"
        "    IF fence OPERATOR(pg_catalog.>) tok THEN\n"
        "      IF NOT byp THEN\n"
        f"        PERFORM fencekit.reject('stale', {n.lit_tag}, TG_RELID, TG_NAME, NULL, NULL, "
        "NULL, tok,\n"
        "                                fence);\n"
        "      END IF;\n"
        f"      PERFORM fencekit.count_event({n.lit_tag}, TG_RELID, 'bypassed');\n"
        "    END IF;\n"
        "    RETURN NULL;\n"
        "  END IF;\n"
    )


def statement_objects(n: Names) -> tuple[list[Function], list[Trigger]]:
    scope = n.spec.scope
    body = (
        n.title(f"statement check ({scope} fence)") + "DECLARE\n"
        "  raw pg_catalog.text;\n"
        "  tok pg_catalog.int8;\n"
        "  byp pg_catalog.bool;\n"
        "  fence pg_catalog.int8;\n"
        # Only the table fence's step (table.py) reads these; plpgsql_check flags unused ones.
        + ("  bad pg_catalog.record;\n" if scope is Scope.TABLE else "")
        + ("  lb pg_catalog.record;\n" if scope is Scope.TABLE and n.spec.lease_bound else "")
        + "BEGIN\n"
        + _fast_path(n)
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
        + _truncate(n)
        + table_fence(n)
        + "  RETURN NULL;\n"
        "END\n"
    )
    if scope is Scope.TABLE:
        # It writes fencekit.fences: runs as the role that ran protect (see objects.Function).
        stmt = definer_function(n.function, "stmt", body, ())
    else:
        stmt = n.function("stmt", "\n" + body)
    truncate = Trigger(n.trigger("trunc"), "BEFORE TRUNCATE", "STATEMENT", stmt)
    if scope is Scope.KEY:
        # A key fence judges every INSERT, UPDATE and DELETE after the statement, by the
        # token it reads then (key.py); a check before it would add a call and judge nothing.
        return [stmt], [truncate]
    return [stmt], [
        Trigger(n.trigger("stmt"), "BEFORE INSERT OR UPDATE OR DELETE", "STATEMENT", stmt),
        truncate,
    ]
