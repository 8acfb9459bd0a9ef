"""Key fences: rows that share key values share one fence in ``fencekit.fences``.

Set-based, once per statement: an AFTER STATEMENT trigger reads the distinct keys the statement
wrote from its transition tables (only the trigger can: they are visible nowhere else) and hands
them to ``fencekit.judge_fences`` (45_judge.sql). A key whose fence already holds the token (the
holder writing again, the common case) is share-locked (``FOR SHARE``) and passes: writers under
the same token never wait for each other, while an advance to a higher token (an exclusive row
lock) waits until they commit, so no write under a lower token commits after a higher token
advanced the fence.

There is no statement check before INSERT, UPDATE or DELETE (only before TRUNCATE): everything
is judged here, once, by the token read at the end of the statement.

The functions run as the role that ran protect (they write ``fencekit.fences``, which writers may
not) with pinned settings: a key's identity is its text under TimeZone=UTC, ISO dates and hex
bytea, so two sessions with other settings always name the same key the same way. Protect
refuses key types whose equal values can print differently (``fencekit.check_key_columns``).
"""

from __future__ import annotations

from fencekit.ident import quote_ident
from fencekit.sqlgen.common import Names, attribute, definer_function, judge_fences, statement_token
from fencekit.sqlgen.objects import Function, Trigger
from fencekit.sqlgen.text import TOKEN, TOKEN_FAST, comment, lit

__all__ = ["KEY_SETTINGS", "key_expression", "key_objects"]

#: Settings that decide how the allowed key types print; pinned for every key function.
KEY_SETTINGS: tuple[tuple[str, str], ...] = (
    ("timezone", "'UTC'"),
    ("datestyle", "'ISO, YMD'"),
    ("intervalstyle", "'postgres'"),
    ("bytea_output", "'hex'"),
    ("extra_float_digits", "1"),
)


def key_expression(columns: tuple[str, ...], alias: str) -> str:
    """A key's identity as text: one column's text, or a record of the columns' texts (so
    integer and text columns of different widths name a shared resource's keys alike)."""
    cols = [f"{alias}.{quote_ident(c)}::pg_catalog.text" for c in columns]
    if len(cols) == 1:
        return cols[0]
    return f"ROW({', '.join(cols)})::pg_catalog.text"


def _keys(n: Names, sources: list[str]) -> str:
    """SQL: the statement's distinct keys as text, sorted (every lock a key fence takes is
    taken in key order, so two writers never deadlock on fences)."""
    # Qualified: a key column may be named like a variable of the function (raw, tok).
    cols = ", ".join(f"y.{quote_ident(c)}" for c in n.spec.key)
    if len(sources) == 1:
        rows = f"{sources[0]} AS x"
    else:
        union = "\n                            UNION ALL ".join(
            f"SELECT {cols} FROM {s} AS y" for s in sources
        )
        rows = f"({union}) AS x"
    return (
        f"ARRAY(SELECT DISTINCT {key_expression(n.spec.key, 'x')}\n"
        f"                      FROM {rows} ORDER BY 1)"
    )


def _token(n: Names) -> str:
    """PL/pgSQL: ``tok``, the statement's token. The common case (a canonical token below
    10^18, no bypass asked for, the right issuer) is one inline condition on the value read
    once into ``raw``; anything else is judged by ``fencekit.statement_token``, which reads
    the token itself and says what is wrong (a call, with its settings, per statement saved)."""
    issuer = ""
    if n.spec.issuer is not None:
        issuer = (
            "\n      AND (COALESCE(pg_catalog.current_setting('fencekit.issuer', true), '') "
            "OPERATOR(pg_catalog.=) ''\n"
            "           OR pg_catalog.current_setting('fencekit.issuer', true) "
            f"OPERATOR(pg_catalog.=) {lit(n.spec.issuer)})"
        )
    return (
        f"  IF raw OPERATOR(pg_catalog.~) {TOKEN_FAST}\n"
        "      AND COALESCE(pg_catalog.current_setting('fencekit.bypass', true), '') "
        f"OPERATOR(pg_catalog.=) ''{issuer} THEN\n"
        "    tok := raw::pg_catalog.int8;\n"
        "  ELSE\n"
        f"    tok := {statement_token(n)};\n"
        "  END IF;\n"
    )


def _body(n: Names, sources: list[str]) -> str:
    spec = n.spec
    key_cols = ", ".join(quote_ident(c) for c in spec.key)
    label = spec.key[0] if len(spec.key) == 1 else f"({', '.join(spec.key)})"
    return (
        n.title(f"key fence ({comment(key_cols)}), resource {comment(n.resource)}")
        + f"DECLARE\n  raw pg_catalog.text := {TOKEN};  -- read once\n"
        "  tok pg_catalog.int8;\nBEGIN\n" + _token(n) + "  IF tok IS NOT NULL THEN\n"
        # Before any key's text is computed (plpgsql plans the statement below only when it
        # reaches it): a key column retyped to a type of the owner's would run its cast as us.
        f"    PERFORM fencekit.check_key_types({n.lit_tag}, TG_RELID::pg_catalog.regclass);\n"
        + judge_fences(n, _keys(n, sources), label)
        + attribute(n)
        + "  END IF;\n  RETURN NULL;\nEND\n"
    )


def key_objects(n: Names) -> tuple[list[Function], list[Trigger]]:
    def fn(suffix: str, sources: list[str]) -> Function:
        return definer_function(n.function, suffix, _body(n, sources), KEY_SETTINGS)

    ins = fn("ins", ["fencekit_new"])
    upd = fn("upd", ["fencekit_new", "fencekit_old"])
    dele = fn("del", ["fencekit_old"])
    return [ins, upd, dele], [
        Trigger(
            n.trigger("ins"),
            "AFTER INSERT",
            "STATEMENT",
            ins,
            referencing="NEW TABLE AS fencekit_new",
        ),
        Trigger(
            n.trigger("upd"),
            "AFTER UPDATE",
            "STATEMENT",
            upd,
            referencing="OLD TABLE AS fencekit_old NEW TABLE AS fencekit_new",
        ),
        Trigger(
            n.trigger("del"),
            "AFTER DELETE",
            "STATEMENT",
            dele,
            referencing="OLD TABLE AS fencekit_old",
        ),
    ]
