"""``fencekit chaos``: workers, leases and a nemesis; a checker over the recorded history."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

DESCRIPTION = """\
Prove fencing under faults. N worker processes contend for leases (PostgreSQL issuer, short
ttl) on M resources and read-modify-write a register under their tokens; a nemesis pauses
workers with SIGSTOP past their ttl, kills them with SIGKILL, and crash-restarts PostgreSQL
(immediate shutdown; with --pgbouncer, pgbouncer is restarted while the server is down). Every
write, its token and its outcome (acknowledged, rejected, unknown) is recorded, and a checker
compares the history with the database: no acknowledged write with a token lower than an
earlier one on the same resource, none lost across a crash, every rejection justified, and the
final state equal to replaying the committed writes.

Server: a throwaway PostgreSQL started from the system's binaries (Debian's
/usr/lib/postgresql/<v>/bin or FENCEKIT_PG_BINDIR) so that it can be crashed; without them the
embedded server, without crashes. With --dsn: a database created (and dropped) on your server,
without crashes (the role needs CREATEDB and CREATEROLE).

Workers connect as an application role, never as a superuser: the run creates a throwaway
login role (fencekit_chaos_worker_<random>, with a random password), grants it DML on the chaos
tables and fencekit_writer (to take leases) and nothing else, and drops it after the run. The
role of --dsn only sets up, watches and checks.

Faults beyond pauses, kills and crashes: --issuer etcd|zookeeper (a three-node cluster on
loopback; its leader killed and members paused mid-run), --clock-faults (libfaketime steps,
skews and freezes the workers' clocks and the server's), --net-faults (pgbouncer paused with
commits in flight: indeterminate writes). The checker also checks the leases themselves:
tokens unique and rising in real time, no two holders at once beyond the issuer's contract.

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
    from fencekit.chaos.run import ISSUERS, SCOPES

    p: argparse.ArgumentParser = subparsers.add_parser(
        "chaos",
        help="chaos run: leases, pauses, kills and crashes, checked against the history",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
        "--no-crash", dest="crashes", action="store_false", help="never crash the server"
    )
    p.add_argument(
        "--dsn",
        help="run on your server: a database and the workers' role are created and dropped "
        "(needs CREATEDB and CREATEROLE)",
    )
    p.add_argument(
        "--pgbouncer",
        action="store_true",
        help="workers connect through a pgbouncer (transaction mode) that the run starts",
    )
    p.add_argument("--history", type=Path, help="write the merged history (JSON lines) here")
    p.add_argument("--json", action="store_true", help="print the summary as JSON at the end")
    p.add_argument(
        "--issuer",
        choices=ISSUERS,
        default="postgres",
        help="lease issuer: fencekit's PostgreSQL issuer (default), or a three-node etcd "
        "cluster / ZooKeeper ensemble started on loopback, leader killed and members paused",
    )
    p.add_argument(
        "--clock-faults",
        action="store_true",
        help="libfaketime steps, skews and freezes the workers' and the server's clocks "
        "(Debian package faketime)",
    )
    p.add_argument(
        "--net-faults",
        action="store_true",
        help="pause pgbouncer (SIGSTOP) with commits in flight: indeterminate writes "
        "(implies --pgbouncer)",
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
    from fencekit.chaos.history import HistoryError, load_history

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


def run(args: argparse.Namespace) -> int:
    from fencekit.chaos.run import ChaosConfig, ChaosSetupError, run_chaos
    from fencekit.chaos.server import ServerError

    try:
        cfg = ChaosConfig(
            duration=args.duration,
            seed=args.seed,
            workers=args.workers,
            resources=args.resources,
            fence=args.fence,
            scope=args.scope,
            dsn=args.dsn,
            pgbouncer=args.pgbouncer,
            history=args.history,
            ttl=args.ttl,
            crashes=args.crashes,
            issuer=args.issuer,
            clock_faults=args.clock_faults,
            net_faults=args.net_faults,
            report=args.report,
            issuer_factory=args.issuer_factory,
        )
    except ValueError as exc:
        print(f"fencekit chaos: {exc}", file=sys.stderr)
        return 2
    try:
        result = run_chaos(cfg)
    except (ChaosSetupError, ServerError) as exc:
        print(f"fencekit chaos: error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        summary = {"ok": result.ok, "server": result.server, "worker_role": result.worker_role}
        print(json.dumps({**summary, **result.report.as_dict()}))
    return 0 if result.ok else 1
