"""Quoting and object naming: the one place where names become SQL text.

Identifiers are quoted with pglast's keyword-aware rules (quotes only where PostgreSQL needs
them, ``"`` doubled); literals are standard-conforming strings. fencekit's own objects are named
``<readable prefix>_<hash>`` so that long table names never collide after PostgreSQL's 63-byte
truncation, and every owned object is recognisable by its prefix.
"""

from __future__ import annotations

import hashlib
import re

from pglast.stream import maybe_double_quote_name

__all__ = ["object_tag", "quote_ident", "quote_literal"]

_TAG_PREFIX_BYTES = 24


def quote_ident(name: str) -> str:
    """Quote one identifier (schema, table, column, function, trigger name)."""
    if not name or "\x00" in name:
        raise ValueError(f"invalid identifier {name!r}")
    quoted: str = maybe_double_quote_name(name)
    return quoted


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
