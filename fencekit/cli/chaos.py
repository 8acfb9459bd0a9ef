"""``fencekit chaos``: workers, leases and a nemesis; a checker over the recorded history."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fencekit.chaos.run import ChaosConfig, Environment

DESCRIPTION = """\
Prove fencing under faults, on your database or the embedded server. N worker processes
contend for leases (short ttl) on M resources and read-modify-write a register under their
tokens; a nemesis pauses workers with SIGSTOP past their ttl and kills them with SIGKILL. Every
write, its token and its outcome (acknowledged, rejected, unknown) is recorded, and a checker
compares the history with the database: no acknowledged write with a token lower than an
earlier one on the same resource, no write accepted after a newer grant, no acknowledged write
lost, every rejection justified, and the final state equal to replaying the committed writes.
It also checks the leases themselves: tokens unique and rising in real time, no two holders at
once beyond the issuer's contract.

Server: with --dsn, a database created (and dropped) on your server (the role needs CREATEDB
and CREATEROLE); else the embedded PostgreSQL (pip install 'pg-fencekit[embedded]'). Leases
come from fencekit's PostgreSQL issuer, or from your etcd cluster / ZooKeeper ensemble
(--issuer etcd|zookeeper --endpoints host:port,...).

Workers connect as an application role, never as a superuser: the run creates a throwaway
login role (fencekit_chaos_worker_<random>, with a random password), grants it DML on the chaos
tables and fencekit_writer (to take leases) and nothing else, and drops it after the run. The
role of --dsn only sets up, watches and checks.

Server crashes, pgbouncer paused with commits in flight, faked clocks and issuer nodes killed
need servers the run starts itself: that is the lab's run, from a checkout (python -m
tests.lab chaos --help; docs/chaos.md).

`fencekit chaos check HISTORY` checks a saved history (--history) again, or one from your own
system written in the same JSON-lines format (docs/chaos.md).

Exit status: 0 when the outcome is the one expected for the mode (no violation fenced; at
least one violation with --no-fence), 1 otherwise, 2 on bad usage.
"""

CHECK_DESCRIPTION = """\
Check a saved chaos history (JSON lines, as --history writes it): lease safety (tokens unique
and rising in real time, no overlapping holders beyond the issuer's contract), the fence (no
stale or unfenced write accepted), durability (nothing acknowledged lost, nothing failed
applied) and lost updates. The history must end with the database's final state (`committed`
and `register` events); without it only the leases and the rejections are checked, and the
output says so. Scope and issuer come from the history's `run` event unless given.

Exit status: 0 no violation, 1 violations found, 2 unreadable or malformed history.
"""


def register(subparsers: Any) -> argparse.ArgumentParser:
    from fencekit.chaos.run import SCOPES

    p: argparse.ArgumentParser = subparsers.add_parser(
        "chaos",
        help="chaos run: leases, paused and killed workers, checked against the history",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_run_arguments(p)
    p.set_defaults(func=run)
    sub = p.add_subparsers(dest="chaos_command", metavar="{check}")
    c: argparse.ArgumentParser = sub.add_parser(
        "check",
        help="check a saved history",
        description=CHECK_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument("history", type=Path, metavar="HISTORY", help="history file (JSON lines)")
    c.add_argument("--scope", choices=SCOPES, help="fence scope (default: from the history)")
    c.add_argument("--issuer", help="issuer whose contract applies (default: from the history)")
    c.add_argument("--json", action="store_true", help="print the summary as JSON at the end")
    c.add_argument("--report", type=Path, metavar="HTML", help="write an HTML timeline too")
    c.set_defaults(func=check_history)
    return p


def check_history(args: argparse.Namespace) -> int:
    from fencekit.chaos.checker import check, format_report
    from fencekit.chaos.history import load_history
    from fencekit.errors import HistoryError

    try:
        events = load_history(args.history)
        report = check(events, scope=args.scope, issuer=args.issuer)
    except HistoryError as exc:
        print(f"fencekit chaos check: error: {exc}", file=sys.stderr)
        return 2
    print(f"fencekit chaos check: {args.history} ({len(events)} events)")
    print(format_report(report))
    if args.report is not None:
        from fencekit.chaos.report import write_html

        try:
            write_html(events, report, args.report, title=f"fencekit chaos check {args.history}")
        except (RuntimeError, OSError) as exc:
            print(f"fencekit chaos check: error: {exc}", file=sys.stderr)
            return 2
    verdict = "OK: no violation" if not report.violations else "FAILED"
    print(f"\n{verdict}: {len(report.violations)} violation(s)")
    if args.json:
        print(json.dumps({"ok": not report.violations, **report.as_dict()}))
    return 0 if not report.violations else 1


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The options of a chaos run (the lab's run adds its own to the same parser)."""
    from fencekit.chaos.run import ISSUERS, SCOPES

    p.add_argument("--duration", type=float, default=20.0, help="seconds (default: 20)")
    p.add_argument("--seed", type=int, default=0, help="seed of the nemesis and workers")
    p.add_argument("--workers", type=int, default=4, help="worker processes (default: 4)")
    p.add_argument("--resources", type=int, default=3, help="contended resources (default: 3)")
    p.add_argument("--ttl", type=float, default=0.5, help="lease ttl in seconds (default: 0.5)")
    p.add_argument(
        "--scope",
        choices=SCOPES,
        default="key",
        help="how the register is fenced (default: key)",
    )
    p.add_argument(
        "--no-fence",
        dest="fence",
        action="store_false",
        help="leave the register unprotected: the checker must find lost updates",
    )
    p.add_argument(
        "--dsn",
        help="run on your server: a database and the workers' role are created and dropped "
        "(needs CREATEDB and CREATEROLE)",
    )
    p.add_argument("--history", type=Path, help="write the merged history (JSON lines) here")
    p.add_argument("--json", action="store_true", help="print the summary as JSON at the end")
    p.add_argument(
        "--issuer",
        choices=ISSUERS,
        default="postgres",
        help="lease issuer: fencekit's PostgreSQL issuer (default), or your etcd cluster / "
        "ZooKeeper ensemble at --endpoints",
    )
    p.add_argument(
        "--endpoints",
        default="",
        metavar="HOST:PORT,...",
        help="client endpoints of the etcd cluster or ZooKeeper ensemble (--issuer)",
    )
    p.add_argument(
        "--report",
        type=Path,
        metavar="HTML",
        help="write a self-contained HTML timeline of the run (needs the chaos extra: plotly)",
    )
    p.add_argument(
        "--issuer-factory",
        metavar="MODULE:FUNCTION",
        help="testing the checker: workers take their leases from FUNCTION(worker_args) "
        "(e.g. tests.chaos.broken_issuer:make, a deliberately broken issuer, from the "
        "repository's root); the run then succeeds only if the checker finds violations",
    )


def config_from_args(args: argparse.Namespace) -> ChaosConfig:
    """The run's configuration from the options of :func:`add_run_arguments` (ValueError)."""
    from fencekit.chaos.run import ChaosConfig

    return ChaosConfig(
        duration=args.duration,
        seed=args.seed,
        workers=args.workers,
        resources=args.resources,
        fence=args.fence,
        scope=args.scope,
        dsn=args.dsn,
        history=args.history,
        ttl=args.ttl,
        issuer=args.issuer,
        endpoints=args.endpoints,
        report=args.report,
        issuer_factory=args.issuer_factory,
    )


def run(args: argparse.Namespace, environment: Environment | None = None) -> int:
    """``fencekit chaos``; the lab calls it with its own :class:`Environment`."""
    from fencekit.chaos.run import run_chaos
    from fencekit.errors import ChaosSetupError, EmbeddedServerError

    prog = "fencekit chaos" if environment is None else "chaos"
    try:
        cfg = config_from_args(args)
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    try:
        result = run_chaos(cfg, environment=environment)
    except (ChaosSetupError, EmbeddedServerError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        summary = {"ok": result.ok, "server": result.server, "worker_role": result.worker_role}
        print(json.dumps({**summary, **result.report.as_dict()}))
    return 0 if result.ok else 1
