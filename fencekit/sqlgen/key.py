"""Key fences: rows that share key values share one fence in ``fencekit.fences``.

Set-based, once per statement: an AFTER STATEMENT trigger reads the distinct keys the statement
wrote from its transition tables and judges them in one query. A key whose fence already holds
the token (the holder writing again, the common case) is share-locked (``FOR SHARE``) and
passes: writers under the same token never wait for each other, while an advance to a higher
token (an exclusive row lock) waits until they commit, so no write under a lower token commits
after a higher token advanced the fence. Only keys that need advancing, or look stale, go to
``fencekit.advance_fences``, which advances, locks and judges them.

There is no statement check before INSERT, UPDATE or DELETE (only before TRUNCATE): everything
is judged here, once, by the token read at the end of the statement.

The functions run as the role that ran protect (they write ``fencekit.fences``, which writers may
not) with pinned settings: a key's identity is its text under TimeZone=UTC, ISO dates and hex
bytea, so two sessions with other settings always name the same key the same way. Protect
refuses key types whose equal values can print differently (``fencekit.check_key_columns``).
"""

from __future__ import annotations

from fencekit.ident import quote_ident
from fencekit.sqlgen.common import Names, definer_function, issuer_check, validate_token
from fencekit.sqlgen.objects import Function, Trigger
from fencekit.sqlgen.text import TOKEN, comment, lit

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


def _lease_check(n: Names, label: str) -> str:
    if not n.spec.lease_bound:
        return ""
    return (
        f"  SELECT * INTO lb FROM fencekit.lease_mismatch({n.resource}, s.keys, tok);\n"
        "  IF lb.bad_key IS NOT NULL\n"
        f"     AND NOT fencekit.bypass_allowed({n.lit_tag}, TG_RELID, TG_NAME) THEN\n"
        f"    PERFORM fencekit.reject('lease_mismatch', {n.lit_tag}, TG_RELID, TG_NAME, "
        f"{lit(n.spec.key[0])},\n"
        f"      fencekit.lease_resource({n.resource}, lb.bad_key),\n"
        f"      pg_catalog.json_build_object({lit(label)}, lb.bad_key)::pg_catalog.jsonb, tok, "
        "lb.lease_token);\n"
        "  END IF;\n"
    )


def _judge_keys(n: Names, sources: list[str]) -> str:
    """One query: the statement's distinct keys, whether every one's fence already holds the
    token and, only then, those fences share-locked in key order. Every lock a key fence takes
    is taken in key order (advance_fences does the rest in one pass): locking some keys here
    and others there would break that order, and two writers could deadlock."""
    spec = n.spec
    cols = ", ".join(quote_ident(c) for c in spec.key)
    union = "\n                      UNION ALL ".join(f"SELECT {cols} FROM {s}" for s in sources)
    mine = ""
    if spec.on_equal == "reject":
        # The token's own fence passes only for the transaction that set it.
        mine = (
            "\n                     AND f.writer_xact OPERATOR(pg_catalog.=) "
            "pg_catalog.pg_current_xact_id()"
        )
    fence = (
        f"f.resource OPERATOR(pg_catalog.=) {n.resource}\n"
        "                     AND f.key OPERATOR(pg_catalog.=) k.key\n"
        f"                     AND f.fence OPERATOR(pg_catalog.=) tok{mine}"
    )
    return (
        "  -- OFFSET 0 keeps one index lookup per key, however many fences the resource has.\n"
        "  WITH k AS MATERIALIZED (\n"
        f"         SELECT DISTINCT {key_expression(spec.key, 'x')} AS key\n"
        f"           FROM ({union}) AS x\n"
        "          ORDER BY 1),\n"
        "       j AS (\n"
        "         SELECT pg_catalog.bool_or(k.key IS NULL) AS null_key,\n"
        "                pg_catalog.array_agg(k.key) AS keys,\n"
        "                pg_catalog.count(*) FILTER (WHERE h.hit IS NULL) AS todo\n"
        "           FROM k LEFT JOIN LATERAL (\n"
        "                  SELECT true AS hit FROM fencekit.fences f\n"
        f"                   WHERE {fence} OFFSET 0) AS h ON true),\n"
        "       l AS (\n"
        "         SELECT FROM k, LATERAL (\n"
        "                  SELECT FROM fencekit.fences f\n"
        f"                   WHERE {fence}\n"
        "                   FOR SHARE) AS h\n"
        "          WHERE (SELECT j.todo FROM j) OPERATOR(pg_catalog.=) 0)\n"
        "  SELECT j.null_key, j.keys, (SELECT pg_catalog.count(*) FROM l) AS locked\n"
        "    INTO s FROM j;\n"
    )


def _body(n: Names, sources: list[str]) -> str:
    spec = n.spec
    key_cols = ", ".join(quote_ident(c) for c in spec.key)
    label = spec.key[0] if len(spec.key) == 1 else f"({', '.join(spec.key)})"
    first = lit(spec.key[0])
    lease = _lease_check(n, label)
    # Only a lease-bound fence's check (_lease_check) reads it: plpgsql_check flags it unused.
    lease_var = "  lb pg_catalog.record;\n" if spec.lease_bound else ""
    return (
        n.title(f"key fence ({comment(key_cols)}), resource {comment(n.resource)}") + "DECLARE\n"
        f"  raw pg_catalog.text := {TOKEN};  -- read once: the statement is judged by this value\n"
        "  tok pg_catalog.int8;\n"
        "  s pg_catalog.record;\n"
        "  bad pg_catalog.record;\n"
        f"{lease_var}"
        "BEGIN\n"
        "  IF COALESCE(pg_catalog.current_setting('fencekit.bypass', true), '') "
        "OPERATOR(pg_catalog.<>) '' THEN\n"
        "    -- A bypass asked for by a session that may not is refused, even if unneeded.\n"
        f"    PERFORM fencekit.bypass_allowed({n.lit_tag}, TG_RELID, TG_NAME);\n"
        "  END IF;\n"
        "  IF raw IS NULL OR raw OPERATOR(pg_catalog.=) '' THEN\n"
        "    -- No token: bypass, allow, or YF003.\n"
        f"    PERFORM fencekit.unfenced_write({n.lit_tag}, TG_RELID, TG_NAME, {n.allow});\n"
        "    RETURN NULL;\n"
        "  END IF;\n"
        + validate_token(n)
        + "  tok := raw::pg_catalog.int8;\n"
        + issuer_check(n)
        + "  -- Before any key's text is computed (plpgsql plans the query below only now): a\n"
        "  -- key column retyped to a type of the owner's would run its cast as our owner.\n"
        f"  PERFORM fencekit.check_key_types({n.lit_tag}, TG_RELID);\n"
        + _judge_keys(n, sources)
        + "  IF s.keys IS NULL THEN\n"
        "    RETURN NULL;  -- no rows written\n"
        "  END IF;\n"
        "  IF s.null_key THEN\n"
        f"    PERFORM fencekit.reject('usage', {n.lit_tag}, TG_RELID, TG_NAME, {first},\n"
        f"      {n.resource}, NULL, tok, NULL, "
        "'a key column of a key fence is NULL; key columns must be NOT NULL');\n"
        "  END IF;\n"
        + lease
        + "  IF s.locked OPERATOR(pg_catalog.=) pg_catalog.cardinality(s.keys) THEN\n"
        "    RETURN NULL;  -- every key's fence holds the token, and is share-locked\n"
        "  END IF;\n"
        "  SELECT * INTO bad\n"
        f"    FROM fencekit.advance_fences({n.resource}, s.keys, tok, {lit(spec.on_equal)});\n"
        "  IF bad.bad_reason IS NULL THEN\n"
        "    RETURN NULL;\n"
        "  END IF;\n"
        f"  IF fencekit.bypass_allowed({n.lit_tag}, TG_RELID, TG_NAME) THEN\n"
        f"    PERFORM fencekit.count_event({n.lit_tag}, TG_RELID, 'bypassed');\n"
        "    RETURN NULL;\n"
        "  END IF;\n"
        f"  PERFORM fencekit.reject(bad.bad_reason, {n.lit_tag}, TG_RELID, TG_NAME, {first}, "
        f"{n.resource},\n"
        f"    pg_catalog.json_build_object({lit(label)}, bad.bad_key)::pg_catalog.jsonb, tok, "
        "bad.bad_fence);\n"
        "  RETURN NULL;\n"
        "END\n"
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
