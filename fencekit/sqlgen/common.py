"""What every scope's functions share: names, the function header, validating a token."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from fencekit.ident import object_tag, quote_ident
from fencekit.spec import FenceSpec
from fencekit.sqlgen.objects import Function
from fencekit.sqlgen.text import comment, lit

__all__ = [
    "PINNED_SEARCH_PATH",
    "Names",
    "attribute",
    "definer_function",
    "judge_fences",
    "lit_lines",
    "names_for",
    "spec_json_lines",
    "spec_jsonb",
    "statement_token",
]


def lit_lines(text: str, indent: str, width: int = 100) -> str:
    """``text`` as an SQL string literal, split between words into adjacent literals on lines
    of their own when it is longer than ``width`` (SQL joins literals separated by a line
    break): a stamp or a message stays one value and the line a reviewer reads stays short."""
    words = text.split(" ")
    pieces = [words[0]]
    for word in words[1:]:
        if len(pieces[-1]) + 1 + len(word) > width:
            pieces[-1] += " "
            pieces.append(word)
        else:
            pieces[-1] += " " + word
    return f"\n{indent}".join(lit(p) for p in pieces)


def spec_json_lines(spec: FenceSpec, width: int = 88) -> list[str]:
    """The spec as JSON (keys sorted, as the registry compares it), wrapped between options so
    that no line is longer than ``width`` where one option fits: generated SQL stays readable."""
    items = [
        f"{json.dumps(k)}: {json.dumps(v, sort_keys=True, ensure_ascii=False)}"
        for k, v in sorted(spec.as_dict().items())
    ]
    lines = ["{"]
    for i, item in enumerate(items):
        piece = item + ("," if i < len(items) - 1 else "}")
        if len(lines[-1]) > 1 and len(lines[-1]) + 1 + len(piece) > width:
            lines.append(" " + piece)
        else:
            lines[-1] += ("" if lines[-1] == "{" else " ") + piece
    return lines


def spec_jsonb(spec: FenceSpec, indent: str = "  ") -> str:
    """SQL: the spec as a jsonb literal, wrapped (:func:`spec_json_lines`; jsonb ignores the
    line breaks)."""
    return lit(("\n" + indent).join(spec_json_lines(spec))) + "::pg_catalog.jsonb"


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
        # Cast: every call into fencekit passes exactly the parameter types (no overload wins)
        return lit(self.tag) + "::pg_catalog.text"

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

    @property
    def checked_name(self) -> str:
        """SQL literal: the transaction-local setting where a row fence's statement check
        leaves the token it checked, for the table's row checks to judge by (one per table, so
        a statement on another table that a trigger runs meanwhile leaves it alone)."""
        return lit(f"fencekit.checked_{self.tag}")

    @property
    def checked(self) -> str:
        """SQL: the token the statement check saw ('' for none; NULL when none ran)."""
        return f"pg_catalog.current_setting({self.checked_name}, true)"

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
    make: Callable[..., Function],
    suffix: str,
    body: str,
    settings: tuple[tuple[str, str], ...],
    *,
    table_owner: bool = False,
) -> Function:
    """A SECURITY DEFINER trigger function; its settings (and who owns it) are written into the
    body as a comment so that the body's hash (its stamp) changes whenever they do.
    ``table_owner``: owned by the protected table's owner, not by the role that ran protect
    (see :attr:`fencekit.sqlgen.objects.Function.table_owner`)."""
    pinned = (PINNED_SEARCH_PATH, *settings)
    owner = "; owner: the table's owner" if table_owner else ""
    header = f"-- SECURITY DEFINER{owner}; pinned:\n" + "".join(
        f"--   {k}={v}\n" for k, v in pinned
    )
    return make(
        suffix,
        "\n" + header + body.lstrip("\n"),
        definer=True,
        settings=pinned,
        table_owner=table_owner,
    )


def statement_token(n: Names, *, counted: str | None = None) -> str:
    """SQL: the statement's token, read once and judged by ``fencekit.statement_token``
    (45_judge.sql): NULL when the write goes on without one, else a valid token. A write let
    through without a token is counted (``unfenced`` or ``bypassed``) unless ``counted``, a SQL
    boolean, is false: a row fence's row check passes false when its statement check counted
    the statement already (the statement saw no token)."""
    issuer = lit(n.spec.issuer) if n.spec.issuer is not None else "NULL"
    count = "" if counted is None else f",\n      counted => {counted}"
    return (
        f"fencekit.statement_token(tag => {n.lit_tag}, relid => TG_RELID,\n"
        f"      trigger_name => TG_NAME::pg_catalog.text, allow => {n.allow},\n"
        f"      issuer => {issuer}::pg_catalog.text{count})"
    )


#: The current 10-second period (attribution_lag()): the epoch second / 10, by the clock, not
#: the statement's start (which stays put for a whole CALL, across its COMMITs).
_PERIOD = (
    "(pg_catalog.date_part('epoch', pg_catalog.clock_timestamp())::pg_catalog.int8\n"
    "{i}        OPERATOR(pg_catalog./) 10)::pg_catalog.text"
)


def attribute(n: Names, indent: str = "    ", *, otherwise: bool = True) -> str:
    """PL/pgSQL: in rollout mode (on_missing = allow), attribute the statement that goes on
    without a token to its writer: once per statement, in the check that would refuse it under
    on_missing = reject. Empty otherwise: a table that rejects tokenless writes pays nothing.
    ``otherwise`` puts it in the ELSE of an ``IF tok IS NOT NULL`` block.

    The hit is one expression that writes nothing: a backend that recorded this statement (the
    session's identity and the statement's text, hashed into the name of a session setting,
    ``fencekit.seen_<tag>_<hash>``) in this 10-second period goes on. Anything else (a new
    statement or period) goes to ``fencekit.attribute`` (22_attribution.sql), which records
    it. One expression, and no count: PL/pgSQL prepares each expression again in every
    transaction, each function in it too, so a block, a variable or a count written per
    statement would cost more than the test itself (a writer's count is coarse; see
    ``fencekit.attribute``)."""
    if n.spec.on_missing != "allow":
        return ""
    i = indent
    head = f"{i[2:]}ELSE\n" if otherwise else ""
    seen = (
        f"'fencekit.seen_{n.tag}_'\n"
        f"{i}       OPERATOR(pg_catalog.||) pg_catalog.to_hex(pg_catalog.hashtext("
        "pg_catalog.concat_ws(\n"
        f"{i}         E'\\x1f', session_user, pg_catalog.current_setting('role'),\n"
        f"{i}         pg_catalog.current_setting('application_name'),\n"
        f"{i}         pg_catalog.current_query())))"
    )
    return (
        f"{head}{i}IF (pg_catalog.current_setting({seen}, true)\n"
        f"{i}      OPERATOR(pg_catalog.=) {_PERIOD.format(i=i)}) IS NOT TRUE THEN\n"
        f"{i}  PERFORM fencekit.attribute({n.lit_tag}, TG_RELID);\n"
        f"{i}END IF;\n"
    )


def judge_fences(n: Names, keys: str, key_label: str | None = None, indent: str = "    ") -> str:
    """PL/pgSQL: judge and advance the fences of ``keys`` (SQL: a text[]; NULL for every key
    of the resource) under ``tok`` (``fencekit.judge_fences``, 45_judge.sql)."""
    i = indent
    spec = n.spec
    column = lit(spec.key[0]) if spec.key else "NULL"
    label = lit(key_label) if key_label is not None else "NULL"
    return (
        f"{i}PERFORM fencekit.judge_fences(tag => {n.lit_tag}, relid => TG_RELID,\n"
        f"{i}  trigger_name => TG_NAME::pg_catalog.text,\n"
        f"{i}  resource => {n.resource}::pg_catalog.text, token => tok,\n"
        f"{i}  on_equal => {lit(spec.on_equal)}::pg_catalog.text, "
        f"lease_bound => {'true' if spec.lease_bound else 'false'},\n"
        f"{i}  key_column => {column}::pg_catalog.text, key_label => {label}::pg_catalog.text,\n"
        f"{i}  keys => {keys});\n"
    )
