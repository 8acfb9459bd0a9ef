"""Functions in schema fencekit that fencekit did not create.

Only the installer and superusers create in schema fencekit. Anything else there is hostile
whoever owns it: an overload whose argument types match a call of fencekit's own code more
exactly than the real function would win that call, inside SECURITY DEFINER functions too.
fencekit's own are the core's functions (their signatures read from the install script this
release ships, not from the database) and each protected table's generated trigger functions
(no arguments, named after the table's tag). The fix drops the function; re-owning it would
keep it live.
"""

from __future__ import annotations

import functools
import re

from fencekit.catalog.model import Conn, Drift, DriftKind

__all__ = ["core_signatures", "foreign_function_drift"]

_CREATE = re.compile(r"CREATE(?: OR REPLACE)? (?:FUNCTION|PROCEDURE) fencekit\.(\w+)\(", re.I)
_MODES = {"in", "out", "inout", "variadic"}
# Types whose name is more than one word: the first word is not a parameter name.
_TYPE_WORDS = {"double", "timestamp", "time", "character", "bit", "interval", "pg_catalog"}


def _args(text: str, start: int) -> str:
    """The text between the parenthesis at ``start - 1`` and its match."""
    depth, i = 1, start
    while depth:
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        i += 1
    return text[start : i - 1]


def _split(args: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in args:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return [a for a in (*out, cur) if a.strip()]


def _type_of(arg: str) -> str | None:
    """The type of one parameter declaration; None for an OUT parameter."""
    decl = re.split(r"\s+DEFAULT\s+|\s*=\s*", arg.strip(), maxsplit=1, flags=re.I)[0]
    words = decl.split()
    if words and words[0].lower() in _MODES:
        if words[0].lower() == "out":
            return None
        words = words[1:]
    if len(words) > 1 and words[0].lower() not in _TYPE_WORDS:
        words = words[1:]
    return " ".join(words)


def core_signatures() -> tuple[str, ...]:
    """``fencekit.name(type, ...)`` of every function the core install creates."""
    from fencekit.sqlgen import render_install

    return _signatures(render_install())


@functools.lru_cache(maxsize=2)
def _signatures(sql: str) -> tuple[str, ...]:
    out = []
    for m in _CREATE.finditer(sql):
        types = [t for t in map(_type_of, _split(_args(sql, m.end()))) if t is not None]
        out.append(f"fencekit.{m.group(1)}({', '.join(types)})")
    return tuple(sorted(set(out)))


_FOREIGN = """
SELECT p.oid::pg_catalog.regprocedure::pg_catalog.text,
       pg_catalog.quote_ident(r.rolname)
  FROM pg_catalog.pg_proc p
  JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) p.proowner
 WHERE p.pronamespace OPERATOR(pg_catalog.=) 'fencekit'::pg_catalog.regnamespace::pg_catalog.oid
   AND NOT p.oid OPERATOR(pg_catalog.=) ANY (
         SELECT pg_catalog.to_regprocedure(s)::pg_catalog.oid
           FROM pg_catalog.unnest(%s::pg_catalog.text[]) AS s
          WHERE pg_catalog.to_regprocedure(s) IS NOT NULL)
   AND NOT (p.pronargs OPERATOR(pg_catalog.=) 0::pg_catalog.int2
            AND EXISTS (SELECT FROM fencekit.protected t
                         WHERE pg_catalog.starts_with(p.proname::pg_catalog.text,
                                 t.tag OPERATOR(pg_catalog.||) '_'::pg_catalog.text)))
 ORDER BY 1
"""


def foreign_function_drift(conn: Conn) -> list[Drift]:
    """One drift per function in schema fencekit that fencekit did not create."""
    rows = conn.execute(_FOREIGN, (list(core_signatures()),)).fetchall()
    return [
        Drift(
            DriftKind.FOREIGN_FUNCTION,
            str(sig),
            f"function {sig} (owner {owner}) is in schema fencekit but fencekit did not create "
            "it: only the installer and superusers can create there, and a function there can "
            "be an overload that wins a call of fencekit's own code (SECURITY DEFINER functions "
            "included) by matching its argument types more exactly. Do not give it another "
            "owner, which keeps it callable; drop it, and find out how it got there",
            f"DROP FUNCTION {sig}",
            (f"function {sig}",),
        )
        for sig, owner in rows
    ]
