"""``fencekit bench``: every benchmark, one table of ratios and a scaling table."""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import sys
from collections.abc import Iterator
from typing import Any

DESCRIPTION = """\
Measure what fencing costs, as ratios: each benchmark runs the same work on a protected table
and on an identical unprotected twin, interleaved, and reports the median ratio (fenced /
baseline for times, the other way round for throughput; see the target column). Groups: core
(triggers in PostgreSQL: bulk and one-row writes beside the hand-written conditional UPDATE,
the key fence against its design floor, eight same-token connections), adapters (psycopg,
psycopg2, asyncpg and SQLAlchemy carrying the token), leases (the PostgreSQL issuer), rollout
(a write without a token under on_missing=allow beside the same write with one, idle and with
another session holding 1,000 locks), scaling (cost per row for 1k..1M rows; per one-row write
and per bulk UPDATE for 1k..1M fenced keys).

Runs on a throwaway embedded PostgreSQL unless --dsn is given; with --dsn it creates a database
of its own (the role needs CREATEDB) and drops it at the end. Progress goes to stderr. The
machine's load shows in the numbers: run it on a quiet machine and compare ratios, not times.
"""


def register(subparsers: Any) -> argparse.ArgumentParser:
    from fencekit.bench.report import GROUPS

    p: argparse.ArgumentParser = subparsers.add_parser(
        "bench",
        help="benchmarks: the cost of fencing as ratios, and how it scales",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--dsn", help="run on your server (a database is created and dropped)")
    p.add_argument("--quick", action="store_true", help="fewer rounds and sizes (~2 minutes)")
    p.add_argument(
        "--only",
        default=",".join(GROUPS),
        help=f"comma-separated groups to run (default: {','.join(GROUPS)})",
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    p.set_defaults(func=run)
    return p


@contextlib.contextmanager
def _database(dsn: str | None) -> Iterator[str]:
    """A fresh database with fencekit's core installed, on ``dsn``'s server or an embedded one."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    from fencekit.sqlgen import render_install

    with contextlib.ExitStack() as stack:
        if dsn is None:
            from fencekit.embedded import start_embedded

            print("bench: starting a throwaway embedded PostgreSQL...", file=sys.stderr)
            dsn = stack.enter_context(start_embedded()).dsn
        name = f"fencekit_bench_{secrets.token_hex(4)}"
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            target = make_conninfo(dsn, dbname=name)
            with psycopg.connect(target) as conn:
                conn.execute(render_install().encode())
            yield target
        finally:
            with psycopg.connect(dsn, autocommit=True) as admin:
                admin.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )


def run(args: argparse.Namespace) -> int:
    from fencekit.bench.report import (
        GROUPS,
        format_ratios,
        format_scaling,
        run_all,
        to_markdown,
    )

    groups = [g.strip() for g in args.only.split(",") if g.strip()]
    unknown = [g for g in groups if g not in GROUPS]
    if unknown or not groups:
        print(
            f"fencekit bench: unknown group(s) {', '.join(unknown) or '(none)'}; "
            f"choose from {', '.join(GROUPS)}",
            file=sys.stderr,
        )
        return 2

    def progress(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    with _database(args.dsn) as dsn:
        report = run_all(dsn, groups, quick=args.quick, progress=progress)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2, default=str))
    elif args.markdown:
        print(to_markdown(report, scaling=False))
        if "scaling" in report.results:
            print()
            print(to_markdown(report, scaling=True))
    else:
        mode = "quick" if args.quick else "full"
        print(f"fencekit bench ({mode}): ratios, fenced vs unprotected\n")
        print(format_ratios(report))
        if "scaling" in report.results:
            print("\nScaling: cost per row / per write as the table or the fenced keys grow\n")
            print(format_scaling(report))
    for note in report.notes:
        print(f"note: {note}", file=sys.stderr)
    failed = any("FAILED" in n for n in report.notes)
    return 1 if failed else 0
