"""Row fences: a fence column on each row, checked and advanced by BEFORE ROW triggers.

The hot path of UPDATE and DELETE is one expression (is the token the one the statement check
validated, and not lower than the row's fence); INSERT takes the fence from the column default,
evaluated in C, and runs PL/pgSQL only when the row does not already carry the token. Everything
else (no token, a token changed since the check, a rejection, a bypass) goes through a slow
path that validates the token it read itself.
Every row is judged by the token the statement check validated (``Names.checked``, which that
check sets): a row that reads another valid token is refused (YF004, changed during the
statement), never judged by it; a lower one is refused as stale.

In rollout mode (``on_missing = allow``) the statement check counts and attributes a statement
without a token once, and its rows pass while the check's "no token" stands (see
_passes_tokenless): an UPDATE's or DELETE's row in the row check's second expression, an
INSERT's in its trigger's WHEN clause.
"""

from __future__ import annotations

from fencekit.sqlgen.common import Names, attribute, statement_token
from fencekit.sqlgen.objects import Function, Trigger
from fencekit.sqlgen.text import TOKEN, lit

__all__ = ["FENCE_DEFAULT", "row_objects"]

#: True when ``{t}`` is nothing but 1 to 18 digits. Cheaper than a regular expression (which cost
#: a bulk UPDATE a third more when every row ran one), and it cannot raise.
#: Written only with parts that resolve nothing through search_path: the column default is
#: parsed when protect runs, under the DBA's search_path, and the row triggers run under the
#: writer's.
DIGITS_ONLY = (
    "pg_catalog.btrim({t}, '0123456789') OPERATOR(pg_catalog.=) ''\n"
    "      AND pg_catalog.length({t}) OPERATOR(pg_catalog.>) 0\n"
    "      AND pg_catalog.length({t}) OPERATOR(pg_catalog.<) 19"
)

#: The fence column's default: the token as a bigint when it is all digits, else NULL (the
#: INSERT trigger then runs and judges the token). A non-canonical spelling (``0005``) gets a
#: value whose text differs from the token, so the trigger runs and refuses it. It reads the
#: setting three times rather than ``NULLIF(..., '')::int8`` (cheaper) because it must not
#: raise: another column's default or a VALUES expression can switch the token to ``abc``
#: after the statement check and before this default, and the cast would then fail with 22P02,
#: uncounted, where the trigger rejects with YF004 (tests/security/test_token_mid_statement.py,
#: "the table's column DEFAULT").
FENCE_DEFAULT = f"CASE WHEN {DIGITS_ONLY.format(t=TOKEN)}\n    THEN {TOKEN}::pg_catalog.int8 END"


def _declare(title: str, fast: bool) -> str:
    raw = f"  raw pg_catalog.text := {TOKEN};  -- read once, for the fast path\n" if fast else ""
    return "\n" + title + f"DECLARE\n{raw}  tok pg_catalog.int8;\nBEGIN\n"


def _accepts(n: Names) -> str:
    return ">" if n.spec.on_equal == "reject" else ">="


def _uncounted(n: Names) -> str:
    """SQL: whether a row let through without a token is counted by its row check: not when its
    statement check saw no token (it counted the statement, once), yes when that check saw a
    token that was cleared since, or none ran."""
    return f"COALESCE({n.checked}\n        OPERATOR(pg_catalog.<>) '', true)"


def _tokenless(n: Names) -> str:
    """SQL for the INSERT trigger's WHEN clause (rollout mode): the statement check saw no token
    (and counted the statement), and no token is set now. The bypass is not read: a tokenless
    row that passes here passes as written with it or without it, and whether the session may
    bypass was judged by the statement check. Qualified throughout: nothing in it resolves
    through search_path."""
    # NULL (never set) or '': no token. IS NOT FALSE rather than COALESCE: one node less.
    return (
        f"{n.checked}\n         OPERATOR(pg_catalog.=) ''"
        f"\n       AND ({TOKEN} OPERATOR(pg_catalog.=) '')\n         IS NOT FALSE"
    )


def _checked(n: Names, accept: str) -> str:
    """The fast path: the token the statement check validated (it leaves in ``Names.checked``
    only a canonical positive bigint, or '' when there is none), read again now, and not lower
    than the fence (higher, under on_equal=reject). Written inline, without a call, for speed:
    the smaller the expression, the less PostgreSQL spends preparing it again in every
    transaction. Anything else, a missing token or one changed since the check included, falls
    through to the slow path, which reads the token again (fencekit.statement_token) and says
    what is wrong. A row never fenced compares as 1, so a token must be positive. Only code
    that writes fencekit's own checked setting, not the token, can make the cast fail: its
    statement then fails (22P02) instead of passing."""
    return (
        # Parenthesised: PL/pgSQL ends an IF condition at the first THEN outside parentheses.
        "  IF (CASE WHEN raw OPERATOR(pg_catalog.=)\n"
        f"                  {n.checked}\n"
        "                AND raw OPERATOR(pg_catalog.<>) ''\n"
        f"           THEN raw::pg_catalog.int8 OPERATOR(pg_catalog.{_accepts(n)}) "
        f"COALESCE(OLD.{n.col}, 1)\n"
        "           ELSE false END) THEN  -- the token checked, not below the fence\n"
        + accept.replace("tok", "raw::pg_catalog.int8")
        + "  END IF;\n"
    )


def _same_as_checked(n: Names, indent: str = "    ") -> str:
    """PL/pgSQL: refuse (YF004) a valid ``tok`` other than the token the statement check saw.
    Something that ran after that check (a trigger of the table's firing before ours, a
    function in the statement) changed fencekit.token: the row is not judged by it. A stale
    token (lower than the fence) is refused as stale before this runs."""
    i = indent
    return (
        # tok is a valid token here (not NULL): "differs" is "not equal, or nothing checked".
        # OPERATOR(pg_catalog.=), not IS DISTINCT FROM: that resolves = through search_path.
        f"{i}IF NOT COALESCE(tok::pg_catalog.text OPERATOR(pg_catalog.=)\n"
        f"{i}                {n.checked}, false) THEN\n"
        f"{i}  PERFORM fencekit.reject('malformed'::pg_catalog.text, {n.lit_tag}, TG_RELID,\n"
        f"{i}    TG_NAME::pg_catalog.text, NULL::pg_catalog.text, NULL::pg_catalog.text,\n"
        f"{i}    NULL::pg_catalog.jsonb, tok, NULL::pg_catalog.int8,\n"
        f"{i}    COALESCE({n.checked}, ''::pg_catalog.text));\n"
        f"{i}END IF;\n"
    )


def _attributed_here(n: Names) -> str:
    """Rollout mode: a row let through without a token that its statement check did not count
    (that check saw a token, cleared since, or none ran) is counted by the slow path, per row,
    and attributed here likewise, so that the rollout report names its writer. Empty
    otherwise."""
    block = attribute(n, "      ", otherwise=False)
    if not block:
        return ""
    return f"    IF {_uncounted(n)} THEN\n{block}    END IF;\n"


def _slow(n: Names, row: str, accept: str, unfenced: str) -> str:
    """The slow path: the token judged by fencekit.statement_token (NULL: none, and the write
    may go on), then compared with the row's fence; a stale write is rejected unless the
    session may bypass (rejected_row), and then passes as written."""
    reason = (
        f"CASE WHEN OLD.{n.col} OPERATOR(pg_catalog.>) tok THEN 'stale' ELSE 'reused' END"
        if n.spec.on_equal == "reject"
        else "'stale'"
    )
    return (
        f"  tok := {statement_token(n, counted=_uncounted(n))};\n"
        "  IF tok IS NULL THEN\n"
        f"{unfenced}"
        f"{_attributed_here(n)}"
        f"    RETURN {row};\n"
        "  END IF;\n"
        f"  IF tok OPERATOR(pg_catalog.{_accepts(n)}) COALESCE(OLD.{n.col}, 0) THEN\n"
        f"{_same_as_checked(n)}"
        f"{accept}"
        "  END IF;\n"
        "  PERFORM fencekit.rejected_row(\n"
        f"    reason => ({reason})::pg_catalog.text,\n    tag => {n.lit_tag},\n"
        f"    relid => TG_RELID, trigger_name => TG_NAME::pg_catalog.text,\n"
        f"    column_name => {lit(n.spec.column)}::pg_catalog.text,\n"
        f"    row_data => pg_catalog.to_jsonb(OLD), token => tok, fence => OLD.{n.col});\n"
        f"  RETURN {row};  -- bypassed: the row passes as written\n"
        "END\n"
    )


def _passes_tokenless(n: Names, unchanged: str, row: str) -> str:
    """Rollout mode (``on_missing = allow``): a row of a statement its check let through
    without a token (and counted, and attributed) passes as written, with no further call,
    while no token is set now, and (UPDATE) its fence column is unchanged. A row that writes
    its fence without a token, or reads a token set after the check, takes the slow path,
    which judges it as before. The token is read again because the checked setting outlives
    its statement (it is the transaction's): on a partition created since protect, which has
    the row checks but not yet the statement check, it is what an earlier statement left.
    Under on_missing=reject there is no such branch: the slow path refuses a tokenless row
    whatever its statement check did."""
    if n.spec.on_missing != "allow":
        return ""
    return (
        f"  IF {n.checked}\n       OPERATOR(pg_catalog.=) ''\n     AND {unchanged} THEN\n"
        f"    RETURN {row};  -- counted and attributed by the statement check\n  END IF;\n"
    )


def row_objects(n: Names) -> tuple[list[Function], list[Trigger]]:
    col = n.col
    title = n.title(f"row fence ({n.spec.column})")
    advance = f"    NEW.{col} := tok;\n    RETURN NEW;\n"
    upd = n.function(
        "upd",
        _declare(title, fast=True)
        + _checked(n, advance)
        + _passes_tokenless(
            n,
            "(raw OPERATOR(pg_catalog.=) '') IS NOT FALSE\n"
            f"     AND COALESCE(NEW.{col} OPERATOR(pg_catalog.=) OLD.{col},\n"
            f"              NEW.{col} IS NULL AND OLD.{col} IS NULL)",
            "NEW",
        )
        + _slow(
            n,
            "NEW",
            advance,
            # Without a token the fence column cannot be written (NEW keeps OLD's fence),
            # unless the session may bypass: then the row passes as written.
            f"    IF NOT fencekit.bypass_allowed({n.lit_tag}, TG_RELID,\n"
            "                                   TG_NAME::pg_catalog.text) THEN\n"
            f"      NEW.{col} := OLD.{col};\n"
            "    END IF;\n",
        ),
    )
    dele = n.function(
        "del",
        _declare(title, fast=True)
        + _checked(n, "    RETURN OLD;\n")
        + _passes_tokenless(n, "(raw OPERATOR(pg_catalog.=) '') IS NOT FALSE", "OLD")
        + _slow(n, "OLD", "    RETURN OLD;\n", ""),
    )
    # Without a token the row keeps the fence it carries: a row that a tokenless UPDATE moves
    # to another partition arrives here with its fence, which must not be cleared; a new row's
    # fence is then only what its own writer wrote (nothing else's is lowered).
    ins = n.function(
        "ins",
        _declare(title, fast=False) + f"  tok := {statement_token(n, counted=_uncounted(n))};\n"
        "  IF tok IS NULL THEN\n"
        + _attributed_here(n)
        + "    RETURN NEW;\n  END IF;\n"
        + _same_as_checked(n, "  ")
        + f"  NEW.{col} := tok;\n  RETURN NEW;\nEND\n",
    )
    # An INSERT's row that already carries the checked token (the one its statement check
    # validated) as its fence, from the column default, needs nothing: the WHEN clause skips
    # the trigger. A fence taken from a token swapped after the check differs, and fires it. A
    # row is skipped only when its fence's text equals the token's, which makes the token a
    # canonical positive bigint; the condition is wrapped in IS NOT TRUE: a NULL anywhere (no
    # token, no fence) fires. PostgreSQL parses a trigger's WHEN clause from its node text
    # again on every statement (tens of microseconds, more than the row check's whole fast
    # path): INSERT keeps it, because it spares a bulk INSERT a PL/pgSQL call per row; UPDATE
    # and DELETE have none, because a one-row write is what fenced workers mostly run
    # (docs/performance.md, "Row fences").
    ins_when = (
        f"NEW.{col} OPERATOR(pg_catalog.>) 0\n"
        f"    AND NEW.{col}::pg_catalog.text OPERATOR(pg_catalog.=)\n      {n.checked}"
    )
    if n.spec.on_missing == "allow":
        # Rollout mode: a row of a statement its check let through without a token passes here
        # too while no token is set (the column default reads the token). The tokenless branch
        # first: its rows skip the rest, a token's rows read one setting.
        ins_when = f"({_tokenless(n)})\n   OR ({ins_when})"
    return [ins, upd, dele], [
        Trigger(n.trigger("ins"), "BEFORE INSERT", "ROW", ins, when=f"({ins_when}) IS NOT TRUE"),
        Trigger(n.trigger("upd"), "BEFORE UPDATE", "ROW", upd),
        Trigger(n.trigger("del"), "BEFORE DELETE", "ROW", dele),
    ]
