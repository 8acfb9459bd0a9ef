"""The lab's commands, run from the repository's root: ``python -m tests.lab --help``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tests.lab",
        description="What proves fencekit and does not ship with it: runs against servers and "
        "clusters the lab starts on loopback (needs a checkout, and the Debian packages and "
        "Patroni virtualenv that ./scripts/test installs).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{chaos,ha}")
    from fencekit.cli.chaos import add_run_arguments
    from tests.lab.chaos import add_lab_arguments

    chaos = sub.add_parser(
        "chaos",
        help="fencekit's chaos run plus server crashes, pgbouncer, clocks and issuer nodes",
        description="fencekit chaos (see `fencekit chaos --help`) on servers the lab starts on "
        "loopback, with the faults only such servers allow: the run's own PostgreSQL "
        "(Debian's binaries, durable commits) crash-restarted; --pgbouncer, and --net-faults "
        "pausing it with commits in flight; --clock-faults (libfaketime on the workers and the "
        "server); --issuer etcd|zookeeper starts a three-node cluster whose leader is killed "
        "and members paused. Exit 0 when the outcome is the one expected for the mode, 1 "
        "otherwise, 2 on bad input.",
    )
    add_run_arguments(chaos)
    add_lab_arguments(chaos)
    ha = sub.add_parser(
        "ha",
        help="chaos run on a two-node Patroni cluster whose primary is killed mid-run",
        description="A two-node Patroni cluster (PostgreSQL 15, etcd, loopback) whose primary is "
        "killed mid-run, with asynchronous and/or synchronous replication; workers contend for "
        "leases of the built-in issuer and write a lease-bound register. Reports the failover, "
        "what it lost, and the chaos checker's verdict (docs/ha.md). Exit 0 when every run "
        "passes, 1 when one fails, 2 on bad input.",
    )
    ha.add_argument(
        "mode", nargs="?", default="both", choices=("async", "sync", "both"),
        help="replication mode of the run (default: both, one after the other)",
    )  # fmt: skip
    ha.add_argument("--duration", type=float, default=20.0, help="seconds per run (default 20)")
    ha.add_argument("--workers", type=int, default=4, help="worker threads (default 4)")
    ha.add_argument("--resources", type=int, default=3, help="leased resources (default 3)")
    ha.add_argument("--ttl", type=float, default=2.0, help="lease ttl in seconds (default 2)")
    ha.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    ha.add_argument("--history", type=Path, help="write the history (JSON lines) here")
    ha.add_argument("--json", action="store_true", help="print a JSON summary last")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "chaos":
        from tests.lab.chaos import cli_run as chaos_run

        return chaos_run(args)
    if args.command == "ha":
        from tests.lab.chaos_ha import cli_run

        args.ha = args.mode
        return cli_run(args)
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
