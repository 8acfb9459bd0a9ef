"""``fencekit demo``: the paused-worker story on a throwaway PostgreSQL (or ``--dsn``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

DESCRIPTION = """\
Show fencing at work with two real worker processes.

Worker A takes the lease on 'billing:42' (the demo prints its token) and starts computing the
account's billing summary; the demo freezes A with SIGSTOP until its lease has expired by the
database clock. A new invoice arrives; worker B takes the lease with the next token and writes
the summary. A is resumed with SIGCONT, finishes and writes its outdated summary: PostgreSQL
rejects it (StaleTokenError, SQLSTATE YF001). The demo prints the timeline, the final row and
the rejection counters (fencekit.rejections).

With --no-fence the table is left unprotected and A's stale summary silently overwrites B's.

With --issuer etcd or --issuer zookeeper the workers take the lease from that server instead of
the built-in PostgreSQL issuer, and the table's resource is bound to that issuer. The server is
found at --issuer-endpoints, else $FENCEKIT_ETCD_ENDPOINTS / $FENCEKIT_ZOOKEEPER_HOSTS, else its
default port on 127.0.0.1; the demo stops with a message (exit status 2) when none answers.

Runs on a throwaway embedded PostgreSQL unless --dsn is given; with --dsn it creates a database
of its own (the role needs CREATEDB) and drops it at the end. Exit status 0 when the outcome is
the one expected for the mode, 1 otherwise, 2 when the demo could not run.
"""


def register(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "demo",
        help="run the paused-worker demo (a stale write rejected by PostgreSQL)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--dsn",
        help="PostgreSQL connection string (default: start a throwaway embedded server)",
    )
    p.add_argument(
        "--no-fence",
        dest="fence",
        action="store_false",
        help="leave the table unprotected: show the lost update fencing prevents",
    )
    p.add_argument(
        "--issuer",
        choices=["postgres", "etcd", "zookeeper"],
        default="postgres",
        help="where leases and tokens come from (default: %(default)s, the built-in issuer)",
    )
    p.add_argument(
        "--issuer-endpoints",
        metavar="HOST:PORT[,...]",
        help="etcd endpoints or ZooKeeper hosts (default: $FENCEKIT_ETCD_ENDPOINTS or "
        "$FENCEKIT_ZOOKEEPER_HOSTS, else 127.0.0.1:2379 / 127.0.0.1:2181)",
    )
    p.add_argument(
        "--ttl",
        type=float,
        default=1.0,
        help="lease ttl in seconds (default: %(default)s)",
    )
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from fencekit.demo import run_demo
    from fencekit.errors import DemoError

    if not 0.2 <= args.ttl <= 30:
        print("fencekit demo: --ttl must be between 0.2 and 30 seconds", file=sys.stderr)
        return 2
    try:
        result = run_demo(
            args.dsn,
            fence=args.fence,
            ttl=args.ttl,
            issuer=args.issuer,
            issuer_endpoints=args.issuer_endpoints,
        )
    except DemoError as exc:
        print(f"fencekit demo: {exc}", file=sys.stderr)
        return 2
    return 0 if result.ok else 1


def main(argv: list[str] | None = None) -> int:
    """Run ``fencekit demo`` alone (the lead's ``fencekit`` command lists this module)."""
    parser = argparse.ArgumentParser(prog="fencekit")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["demo", *(argv if argv is not None else sys.argv[1:])])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
