"""Quoting and object naming: the one place where names become SQL text.

Identifiers are quoted with PostgreSQL's keyword-aware rules (quotes only where PostgreSQL needs
them, ``"`` doubled: the rule of pglast's ``maybe_double_quote_name``, without loading its parser
to quote a name); literals are standard-conforming strings. fencekit's own objects are named
``<readable prefix>_<hash>`` so that long table names never collide after PostgreSQL's 63-byte
truncation, and every owned object is recognisable by its prefix.
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["object_tag", "quote_ident", "quote_literal"]

_TAG_PREFIX_BYTES = 24

_SIMPLE_NAME = re.compile(r"[a-z_][a-z0-9_]*").fullmatch

# PostgreSQL's reserved and type/function-name keywords (kwlist.h, PostgreSQL 18): a name that is
# one of them must be quoted. tests/sqlgen/test_ident.py keeps this equal to pglast's lists.
_QUOTED_KEYWORDS = frozenset(
    """
    all analyse analyze and any array as asc asymmetric authorization binary both case cast
    check collate collation column concurrently constraint create cross current_catalog
    current_date current_role current_schema current_time current_timestamp current_user
    default deferrable desc distinct do else end except false fetch for foreign freeze from
    full grant group having ilike in initially inner intersect into is isnull join lateral
    leading left like limit localtime localtimestamp natural not notnull null offset on only
    or order outer overlaps placing primary references returning right select session_user
    similar some symmetric system_user table tablesample then to trailing true union unique
    user using variadic verbose when where window with
    """.split()  # noqa: SIM905
)


def quote_ident(name: str) -> str:
    """Quote one identifier (schema, table, column, function, trigger name)."""
    if not name or "\x00" in name:
        raise ValueError(f"invalid identifier {name!r}")
    if _SIMPLE_NAME(name) and name not in _QUOTED_KEYWORDS:
        return name
    return '"' + name.replace('"', '""') + '"'


def quote_literal(value: str) -> str:
    """A SQL string literal that means ``value`` whatever ``standard_conforming_strings`` is:
    a plain literal without backslashes reads the same either way, and one with backslashes is
    an escape string (``E'...'``), which reads the same either way (as ``quote_literal()`` and
    ``format('%L')`` in PostgreSQL do)."""
    if "\x00" in value:
        raise ValueError("string literals cannot contain NUL bytes")
    quoted = value.replace("'", "''")
    if "\\" in value:
        return "E'" + quoted.replace("\\", "\\\\") + "'"
    return "'" + quoted + "'"


def object_tag(schema: str, table: str) -> str:
    """A short, stable, collision-free ASCII name stem for a table's fencekit objects.

    The readable part is the table name reduced to ``[a-z0-9_]``; the hash covers the exact
    schema and table names, so two names sharing a long prefix still differ.
    """
    readable = re.sub(r"[^a-z0-9_]+", "_", table.lower()).strip("_")[:_TAG_PREFIX_BYTES]
    digest = hashlib.sha256(f"{schema}\x00{table}".encode()).hexdigest()[:10]
    return f"{readable or 't'}_{digest}"
