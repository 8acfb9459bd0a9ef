"""Small pieces of SQL text every scope uses: dollar quoting, DO blocks, the token reads."""

from __future__ import annotations

from fencekit.ident import quote_literal

__all__ = [
    "TOKEN",
    "comment",
    "do",
    "dollar",
    "lit",
    "token_fast",
]

#: The token as the client set it. Every check reads it ONCE into a variable and validates
#: that value: a statement may change the setting between two checks (set_config in a WHERE,
#: a default, another trigger), so no check may trust what an earlier one read.
TOKEN = "pg_catalog.current_setting('fencekit.token', true)"


def token_fast(value: str, again: str | None = None, indent: str = "       ") -> str:
    """SQL: ``value`` is a canonical positive decimal below 10^18 (no sign, space or leading
    zero), the one test the hot paths make; longer tokens (up to bigint's maximum) take the
    slow path through fencekit.is_valid_token. An unbounded pattern and a length test: a
    bounded repetition (``{0,17}``) costs PostgreSQL's regular expression engine several times
    the length test. ``again`` reads the same value a second time, where ``value`` is an
    expression with an effect (``set_config``)."""
    return (
        f"{value} OPERATOR(pg_catalog.~) '^[1-9][0-9]*$'\n"
        f"{indent}AND pg_catalog.octet_length({again or value}) OPERATOR(pg_catalog.<) 19"
    )


def lit(value: str) -> str:
    return quote_literal(value)


def dollar(body: str, tag: str) -> str:
    """Dollar-quote ``body`` with a tag chosen so that the first place it occurs after the
    opening one is the closing one (names can hold ``$fn$``, or end in ``$fn``)."""
    n = 0
    while (body + f"${tag}{n or ''}$").find(f"${tag}{n or ''}$") != len(body):
        n += 1
    t = f"${tag}{n or ''}$"
    return f"{t}{body}{t}"


def do(body: str) -> str:
    """An anonymous PL/pgSQL block."""
    return "DO " + dollar(body, "do")


def comment(text: str) -> str:
    """Text safe inside a ``--`` comment line: a name may hold a newline."""
    return text.replace("\r", " ").replace("\n", " ")
