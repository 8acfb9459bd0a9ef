"""What the ``fencekit`` commands share: the --dsn, --json, --lock-timeout and fence-spec
options, reading them back (a SQLAlchemy URL becomes a libpq DSN), connecting, running a
generated script and printing text or JSON.

Commands import from here and never from each other (tests/test_layout.py checks it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import TYPE_CHECKING, Any

from fencekit import sqlgen
from fencekit.cli import HelpFormatter
from fencekit.errors import SpecError, UsageError
from fencekit.spec import DEFAULT_COLUMN, FenceSpec, Scope, TableName

if TYPE_CHECKING:
    import psycopg


__all__ = [
    "FMT",
    "TABLE_HELP",
    "connect",
    "dsn_from",
    "dsn_option",
    "emit",
    "json_option",
    "libpq_dsn",
    "lock_timeout_from",
    "lock_timeout_option",
    "parse_table",
    "print_note",
    "run_script",
    "spec_from",
    "spec_options",
    "table_keys",
]


FMT = HelpFormatter


_LOCK_TIMEOUT = re.compile(r"\d+(\.\d+)?\s*(us|ms|s|min|h|d)?")


TABLE_HELP = 'the table, written as SQL writes it: billing, public.billing, "My Schema"."My Table"'


def dsn_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dsn",
        help="PostgreSQL connection string, e.g. postgresql://user@host/db, or a SQLAlchemy URL "
        "such as postgresql+psycopg://user@host/db (default: $FENCEKIT_DSN)",
    )


def json_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object on stdout instead of text (keys: docs/reference.md)",
    )


def lock_timeout_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--lock-timeout",
        default=sqlgen.DEFAULT_LOCK_TIMEOUT,
        metavar="DURATION",
        help="give up instead of queueing behind long transactions for longer than this "
        "(SET LOCAL lock_timeout; e.g. 500ms, 5s, 1min; default: %(default)s)",
    )


def spec_options(p: argparse.ArgumentParser, *, from_ddl: bool) -> None:
    g = p.add_argument_group("fence spec")
    g.add_argument(
        "--key",
        action="append",
        default=[],
        metavar="COL",
        help="key column (repeat for a composite key); implies --scope key",
    )
    g.add_argument(
        "--scope",
        choices=[s.value for s in Scope],
        help="row: a fence per row (default); key: per key value; table: one for the table",
    )
    g.add_argument(
        "--resource",
        metavar="NAME",
        help="named resource (key/table scope) shared by every table protected with it",
    )
    g.add_argument(
        "--on-missing",
        choices=["reject", "allow"],
        default="reject",
        help="a write with no token: reject it (default) or allow it (counted as unfenced)",
    )
    g.add_argument(
        "--on-equal",
        choices=["accept", "reject"],
        default="accept",
        help="a token equal to the fence: accept (default: the holder writes again) or reject "
        "(each token writes once)",
    )
    g.add_argument(
        "--column",
        default=DEFAULT_COLUMN,
        metavar="NAME",
        help="fence column of a row fence (default: %(default)s)",
    )
    g.add_argument("--issuer", metavar="NAME", help="bind the resource to one token issuer")
    lock_timeout_option(p)
    if from_ddl:
        p.add_argument(
            "--from-ddl",
            action="append",
            default=[],
            metavar="FILE",
            help="schema file(s) with CREATE/ALTER TABLE statements to validate against, "
            "read in order (repeatable); no database needed",
        )


def dsn_from(args: argparse.Namespace) -> str:
    dsn = args.dsn or os.environ.get("FENCEKIT_DSN")
    if not dsn:
        raise UsageError("--dsn is required (or set FENCEKIT_DSN)")
    return libpq_dsn(str(dsn))


_SQLALCHEMY_URL = re.compile(r"(?i)^(postgres(?:ql)?)(\+[a-z0-9_]+)?://")


_OTHER_URL = re.compile(r"(?i)^([a-z][a-z0-9_]*)(\+[a-z0-9_]+)?://")


def libpq_dsn(dsn: str) -> str:
    """``dsn`` as libpq takes it: a SQLAlchemy URL (``postgresql+psycopg://...``, as alembic's
    ``sqlalchemy.url`` holds it) loses its driver suffix; other databases are refused."""
    if _SQLALCHEMY_URL.match(dsn):
        return _SQLALCHEMY_URL.sub("postgresql://", dsn, count=1)
    other = _OTHER_URL.match(dsn)
    if other:
        raise UsageError(
            f"--dsn {other.group(0)}... is not a PostgreSQL URL; use postgresql://... "
            "(or postgresql+psycopg://...)"
        )
    return dsn


def emit(args: argparse.Namespace, document: dict[str, Any], text: list[str]) -> None:
    """Print ``document`` as JSON with --json, else the text lines."""
    if getattr(args, "json", False):
        print(json.dumps(document, indent=2, ensure_ascii=False, sort_keys=True))
    else:
        for line in text:
            print(line)


def lock_timeout_from(args: argparse.Namespace) -> str:
    value = str(args.lock_timeout).strip()
    if not _LOCK_TIMEOUT.fullmatch(value):
        raise UsageError(
            f"--lock-timeout {args.lock_timeout!r} is not a duration like 500ms, 5s or 1min"
        )
    return value


def parse_table(text: str) -> TableName:
    try:
        return TableName.parse(text)
    except SpecError as exc:
        raise UsageError(str(exc)) from None


def spec_from(args: argparse.Namespace, table: TableName) -> FenceSpec:
    scope = args.scope or ("key" if args.key else "row")
    try:
        return FenceSpec(
            table=table,
            scope=Scope(scope),
            key=tuple(args.key),
            resource=args.resource,
            on_missing=args.on_missing,
            on_equal=args.on_equal,
            column=args.column,
            issuer=args.issuer,
        )
    except SpecError as exc:
        raise UsageError(str(exc)) from None


def print_note(args: argparse.Namespace, text: str) -> None:
    print(f"{args.prog}: note: {text}", file=sys.stderr)


def connect(dsn: str) -> psycopg.Connection[Any]:
    """An autocommit connection whose search_path is pinned to ``pg_catalog, pg_temp``: no
    query the CLI runs (catalog reads, generated scripts) resolves an operator or function
    through the user's path, where anyone with CREATE on ``public`` can plant one. The TABLE
    arguments still resolve through the user's path (fencekit.catalog.session)."""
    import psycopg

    from fencekit.catalog.session import pin_search_path

    conn = psycopg.connect(dsn, autocommit=True)
    try:
        pin_search_path(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def run_script(conn: psycopg.Connection[Any], script: str, lock_timeout: str) -> None:
    """Run a generated psql script as is (its own BEGIN/COMMIT) in one simple query."""
    import psycopg

    from fencekit.errors import CatalogError

    try:
        conn.execute(script.encode())  # bytes and no params: simple protocol, no % parsing
    except psycopg.errors.LockNotAvailable as exc:
        raise CatalogError(
            f"gave up waiting for a lock after lock_timeout {lock_timeout} (a long transaction "
            "holds one on the table); nothing was changed. Retry when it ends, or pass a "
            "longer --lock-timeout"
        ) from exc


def table_keys(spec: FenceSpec) -> dict[str, Any]:
    """The keys every --json document about one table has."""
    return {
        "table": spec.table.dotted,
        "schema": spec.table.schema,
        "name": spec.table.name,
        "spec": spec.as_dict(),
    }
