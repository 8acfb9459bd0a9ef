"""``fencekit rollout``: who still writes protected tables without a token, and whether a table
is ready to enforce; ``fencekit enforce``: switch a table to ``on_missing = reject`` in one
step, refused while the report shows a writer inside the window.

Both read ``fencekit.catalog.rollout``, which the alembic and Django operations read too.
"""

from __future__ import annotations

import argparse
import shlex
from datetime import datetime, timedelta, timezone
from typing import Any

from fencekit import sqlgen
from fencekit.cli import HelpFormatter
from fencekit.cli.common import (
    TABLE_HELP,
    connect,
    dsn_from,
    dsn_option,
    emit,
    json_option,
    lock_timeout_from,
    lock_timeout_option,
    parse_table,
    run_script,
    table_keys,
)
from fencekit.cli.hints import command_text, fix_text
from fencekit.errors import UsageError

__all__ = ["register"]


def _window_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--window",
        default="7d",
        metavar="DURATION",
        help="a table is ready to enforce when nobody wrote it without a token for this long, "
        "and it was watched at least that long (90s, 30min, 12h, 7d, 2w; default: %(default)s)",
    )


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "rollout",
        help="who still writes protected tables without a token; ready to enforce?",
        formatter_class=HelpFormatter,
        description="Tables protected with --on-missing allow (rollout mode) let writes "
        "without a token through, count them, and record who sent each statement: the login "
        "role and the role it acts as, application_name, the client address, the statement "
        "(pg_stat_statements' text for its query id when installed, else fencekit's with every "
        "literal replaced by ?), when it was first and last seen and about how often. This "
        "reports it per table and ends with a verdict: ready to enforce, with the command and "
        "the migrations that switch the table to --on-missing reject, or the writers to fix, or "
        "the ways to write its rows that its checks do not see (a partition or child without "
        "its checks, a child that also inherits from a table outside the tree). "
        "Exit status 0 when every table reported is ready (or already enforces), 1 otherwise. "
        "Needs fencekit_admin.",
        epilog="examples:\n"
        '  fencekit rollout --dsn "$DSN"\n'
        '  fencekit rollout app.jobs --window 3d --since 1d --dsn "$DSN"\n'
        "  fencekit rollout --json --dsn \"$DSN\" | jq '.tables[] | {table, verdict}'",
    )
    p.add_argument("table", nargs="*", help=TABLE_HELP + " (default: every table in rollout mode)")
    _window_option(p)
    p.add_argument(
        "--since",
        metavar="WHEN",
        help="list only writers seen since then: a duration ago (1d, 6h) or an ISO time",
    )
    json_option(p)
    dsn_option(p)
    p.set_defaults(func=run_rollout, prog=p.prog)

    e = subparsers.add_parser(
        "enforce",
        help="switch a table in rollout mode to --on-missing reject, if nobody writes it "
        "without a token",
        formatter_class=HelpFormatter,
        description="Re-protect TABLE with its registered spec and --on-missing reject (a "
        "policy: changed in place, every fence kept). Refused unless `fencekit rollout` calls "
        "the table ready to enforce: while it shows a writer without a token inside the "
        "window, a way to write its rows that its checks do not see, or checks that do not "
        "record writers (protected before attribution); --force switches anyway.",
        epilog='example:\n  fencekit enforce app.jobs --window 7d --dsn "$DSN"',
    )
    e.add_argument("table", help=TABLE_HELP)
    _window_option(e)
    e.add_argument(
        "--force",
        action="store_true",
        help="switch even while writers without a token are seen (their writes will be "
        "refused with YF003)",
    )
    lock_timeout_option(e)
    json_option(e)
    dsn_option(e)
    e.set_defaults(func=run_enforce, prog=e.prog)


def _window(args: argparse.Namespace) -> timedelta:
    from fencekit.catalog.rollout import parse_duration

    try:
        return parse_duration(args.window)
    except ValueError as exc:
        raise UsageError(f"--window: {exc}") from None


def _since(text: str | None) -> datetime | None:
    from fencekit.catalog.rollout import parse_duration

    if text is None:
        return None
    try:
        return datetime.now(timezone.utc) - parse_duration(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(
            f"--since {text!r} is neither a duration (1d, 6h) nor an ISO time"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def _shown(text: str) -> str:
    """Text from the database on one line: whitespace runs become one space (the output stream
    escapes what is left that is not printable: fencekit.cli.printable)."""
    return " ".join(text.split())


def _human(d: timedelta) -> str:
    s = int(d.total_seconds())
    for unit, n in (("w", 604800), ("d", 86400), ("h", 3600), ("min", 60)):
        if s and s % n == 0:
            return f"{s // n}{unit}"
    return f"{s}s"


def _when(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def enforce_commands(table: Any, window: timedelta) -> dict[str, str]:
    """The command and the migration operations that switch ``table`` to reject."""
    schema, name = table.schema, table.name
    w = _human(window)
    return {
        "command": f'fencekit enforce {shlex.quote(table.dotted)} --window {w} --dsn "$DSN"',
        "alembic": f"op.enforce_fence({name!r}, schema={schema!r}, window={w!r})",
        "django": f"EnforceFence('<Model of {table.dotted}>', window={w!r})",
    }


def run_rollout(args: argparse.Namespace) -> int:
    from fencekit import catalog
    from fencekit.catalog.rollout import rollout_report

    window, since = _window(args), _since(args.since)
    tables = [parse_table(t) for t in args.table]
    with connect(dsn_from(args)) as conn:
        catalog.require_core(conn)
        names = [catalog.existing_table(conn, t) for t in args.table] if tables else None
        report = rollout_report(conn, names, window=window, since=since)
    text: list[str] = []
    docs = []
    for t in report:
        doc = t.as_dict(command_text)
        head = f"{t.spec.table} ({t.spec.describe()})"
        if t.enforced:
            text.append(f"{head}: enforces: writes without a token are refused")
            docs.append(doc)
            continue
        text.append(
            f"{head}: {len(t.writers)} writer(s) without a token"
            + (f", {len(t.shown)} seen since {_when(since)}" if since else "")
            + f"; watched since {_when(t.observed_since)}"
        )
        for i, w in enumerate(t.shown, 1):
            role = w.current_user + (
                f" (login {w.session_user})" if w.session_user != w.current_user else ""
            )
            text.append(
                f"  {i}. {_shown(role)}, application_name {_shown(repr(w.application_name))}"
                + (f", from {w.client_addr}" if w.client_addr else ", local socket")
            )
            text.append(
                f"     ~{w.statements} statement(s), first {_when(w.first_seen)}, "
                f"last {_when(w.last_seen)}"
            )
            qid = f" (query id {w.query_id})" if w.query_id is not None else ""
            text.append(f"     {_shown(w.statement)}{qid}")
        if t.overflow_statements:
            text.append(
                f"  + {t.overflow_statements} statement(s) of writers beyond the cap, last "
                f"{_when(t.overflow_last_seen) if t.overflow_last_seen else '?'} (raise "
                "fencekit.meta's attribution_cap to list them)"
            )
        if t.unattributed_statements and t.unattributed_last_seen is not None:
            text.append(
                f"  + {t.unattributed_statements} tokenless statement(s) not attributed, last "
                f"seen {_when(t.unattributed_last_seen)} (their writer's record was busy, "
                "another session holding its lock, or the table's attribution log was full; "
                "writers are named again once the lock is free or the log is folded)"
            )
        for d in t.unseen:
            text.append(f"  ! {_shown(d.message)}")
            text.append(f"    fix: {_shown(fix_text(d))}")
        commands = enforce_commands(t.spec.table, window)
        doc["enforce"] = commands
        if t.verdict == "uncovered":
            text.append(
                f"  verdict: not ready: {len(t.unseen)} way(s) to write its rows that its checks "
                "do not see (above): nobody can tell who writes through them without a token, "
                "and enforcing would not refuse them. Fix them, then watch the table for "
                f"{_human(window)} and run fencekit rollout again"
            )
        elif t.verdict == "ready":
            text.append(
                f"  verdict: ready to enforce: no write without a token for {_human(window)}. "
                "Switch it with:"
            )
            text.append(f"    {commands['command']}")
            text.append(f"    or in a migration: {commands['alembic']} (alembic)")
            text.append(f"                       {commands['django']} (Django)")
        elif t.verdict == "too_early":
            text.append(
                f"  verdict: not yet: no write without a token so far, but watched for less "
                f"than {_human(window)}; ready at {_when(t.ready_at or t.now)} if it stays so"
            )
        elif t.verdict == "not_attributed":
            text.append(
                "  verdict: unknown: its checks do not record who writes without a token "
                "(protected before attribution): run `fencekit protect` on it again "
                "(same options) and watch it"
            )
        else:
            text.append(
                f"  verdict: not ready: {len(t.blocking)} writer(s) wrote without a token "
                f"within {_human(window)}"
                + (" (and writers beyond the cap)" if t.overflow_blocking else "")
                + (" (and tokenless statements not attributed)" if t.unattributed_blocking else "")
                + ". Fix them: carry the lease's token in those writes (fencekit.fencing(token) "
                "with the driver adapter or the session plugin), then run fencekit rollout again"
            )
        docs.append(doc)
    if not report:
        text.append("no table is in rollout mode (protected with --on-missing allow)")
    ok = all(t.verdict in ("ready", "enforced") for t in report)
    emit(
        args,
        {"tables": docs, "window_seconds": int(window.total_seconds()), "ready": ok},
        text,
    )
    return 0 if ok else 1


def run_enforce(args: argparse.Namespace) -> int:
    from fencekit import catalog
    from fencekit.catalog.rollout import enforce_check, enforce_refusal

    window, lock_timeout = _window(args), lock_timeout_from(args)
    parse_table(args.table)
    with connect(dsn_from(args)) as conn:
        catalog.require_core(conn)
        table = catalog.existing_table(conn, args.table)
        entry = catalog.registered(conn, table)
        if entry is not None and entry.spec.on_missing == "reject":
            emit(args, {"action": "none", **table_keys(entry.spec)}, [f"{table} already enforces"])
            return 0
        why = enforce_refusal(conn, table, window) if args.force else None
        spec = enforce_check(conn, table, window, force=args.force)
        run_script(conn, sqlgen.render_protect(spec, lock_timeout=lock_timeout), lock_timeout)
    emit(
        args,
        {"action": "enforce", **table_keys(spec), "forced": why is not None},
        [f"{table} now refuses writes without a token ({spec.describe()})"]
        + ([f"forced past: {why}"] if why is not None else []),
    )
    return 0
