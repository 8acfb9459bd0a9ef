"""What every scope's functions share: names, the function header, validating a token."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fencekit.ident import object_tag, quote_ident
from fencekit.spec import FenceSpec
from fencekit.sqlgen.objects import Function
from fencekit.sqlgen.text import comment, lit

__all__ = [
    "PINNED_SEARCH_PATH",
    "Names",
    "definer_function",
    "issuer_check",
    "names_for",
    "validate_token",
]

#: What SECURITY DEFINER functions run under (docs/dev/design.md, principle 8).
PINNED_SEARCH_PATH = ("search_path", "pg_catalog, pg_temp")
# Settings are (name, value as SQL): the value is written as is after SET name TO.


@dataclass(frozen=True)
class Names:
    """How one table's objects are named and referred to in generated SQL."""

    spec: FenceSpec
    tag: str

    @property
    def lit_tag(self) -> str:
        return lit(self.tag)

    @property
    def col(self) -> str:
        return quote_ident(self.spec.column)

    @property
    def allow(self) -> str:
        """The on_missing policy as a SQL boolean."""
        return "true" if self.spec.on_missing == "allow" else "false"

    @property
    def resource(self) -> str:
        return lit(self.spec.resource_name)

    def function(self, suffix: str, body: str, **kw: object) -> Function:
        return Function(f"{self.tag}_{suffix}", body, **kw)  # type: ignore[arg-type]

    def trigger(self, suffix: str) -> str:
        return f"fencekit_{self.tag}_{suffix}"

    def title(self, what: str) -> str:
        line = f"fencekit: {what} on {self.spec.table.sql}. Generated; do not edit."
        return f"-- {comment(line)}\n"


def names_for(spec: FenceSpec) -> Names:
    return Names(spec, object_tag(spec.table.schema, spec.table.name))


def definer_function(
    make: Callable[..., Function], suffix: str, body: str, settings: tuple[tuple[str, str], ...]
) -> Function:
    """A SECURITY DEFINER trigger function; its settings are written into the body as a comment
    so that the body's hash (its stamp) changes whenever they do."""
    pinned = (PINNED_SEARCH_PATH, *settings)
    header = "-- SECURITY DEFINER; pinned: " + ", ".join(f"{k}={v}" for k, v in pinned) + "\n"
    return make(suffix, "\n" + header + body.lstrip("\n"), definer=True, settings=pinned)


def validate_token(n: Names, var: str = "raw", indent: str = "  ") -> str:
    """PL/pgSQL: reject ``var`` unless it is a canonical positive bigint (YF004).

    The caller has already handled a missing token. The cheap test comes first; only tokens of
    19 digits (10^18 and up) pay for the full check.
    """
    i = indent
    return (
        f"{i}IF NOT ({var} OPERATOR(pg_catalog.~) '^[1-9][0-9]{{0,17}}$'\n"
        f"{i}        OR fencekit.is_valid_token({var})) THEN\n"
        f"{i}  PERFORM fencekit.reject('malformed', {n.lit_tag}, TG_RELID, TG_NAME, NULL, NULL, "
        "NULL, NULL,\n"
        f"{i}                          NULL, {var});\n"
        f"{i}END IF;\n"
    )


def issuer_check(n: Names) -> str:
    """PL/pgSQL: reject a token the adapter marked as another issuer's (``tok`` is set)."""
    if n.spec.issuer is None:
        return ""
    return (
        "  IF pg_catalog.current_setting('fencekit.issuer', true) OPERATOR(pg_catalog.<>) ''\n"
        "     AND pg_catalog.current_setting('fencekit.issuer', true) "
        f"OPERATOR(pg_catalog.<>) {lit(n.spec.issuer)} THEN\n"
        f"    PERFORM fencekit.reject('issuer_mismatch', {n.lit_tag}, TG_RELID, TG_NAME, NULL, "
        f"{n.resource}, NULL, tok,\n"
        f"                            NULL, {lit(n.spec.issuer)});\n"
        "  END IF;\n"
    )
