"""Identifier quoting without a parser: fencekit.ident's rule is pglast's, word for word."""

from __future__ import annotations

import pytest

from fencekit.ident import _QUOTED_KEYWORDS, quote_ident

pglast_keywords = pytest.importorskip("pglast.keywords")
pglast_stream = pytest.importorskip("pglast.stream")


def test_the_quoted_keywords_are_pglasts() -> None:
    assert (
        pglast_keywords.RESERVED_KEYWORDS | pglast_keywords.TYPE_FUNC_NAME_KEYWORDS
    ) == _QUOTED_KEYWORDS


@pytest.mark.parametrize(
    "name", ["a", "billing_summary", "A", "Mixed", "a b", 'say "hi"', "é", "_x", "1a", "a$", ""]
)
def test_a_name_is_quoted_as_pglast_quotes_it(name: str) -> None:
    if not name:
        with pytest.raises(ValueError, match="invalid identifier"):
            quote_ident(name)
        return
    assert quote_ident(name) == pglast_stream.maybe_double_quote_name(name)


def test_every_keyword_is_quoted_as_pglast_quotes_it() -> None:
    every = (
        pglast_keywords.RESERVED_KEYWORDS
        | pglast_keywords.TYPE_FUNC_NAME_KEYWORDS
        | pglast_keywords.COL_NAME_KEYWORDS
        | pglast_keywords.UNRESERVED_KEYWORDS
    )
    assert {quote_ident(k) for k in every} == {
        pglast_stream.maybe_double_quote_name(k) for k in every
    }
