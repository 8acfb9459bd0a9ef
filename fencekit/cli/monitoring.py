"""``fencekit monitoring``: print the files that ship for monitoring fencekit in the database.

They live in the package (``fencekit/monitoring/``) so that they match the views of the core
this fencekit installs; printing them beats a path into site-packages, which differs per
install and disappears on upgrade.
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from typing import Any

from fencekit.cli import HelpFormatter

__all__ = ["FILES", "read"]

#: Subcommand -> file under fencekit/monitoring/.
FILES = {
    "postgres-exporter": "postgres_exporter.yaml",
    "grafana": "grafana-dashboard.json",
}


def read(name: str) -> str:
    """The text of a monitoring file (a value of :data:`FILES`)."""
    return (resources.files("fencekit") / "monitoring" / name).read_text(encoding="utf-8")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "monitoring",
        help="print the postgres_exporter query file or the Grafana dashboard",
        formatter_class=HelpFormatter,
        description="Print a monitoring file that ships with fencekit. postgres-exporter: custom "
        "queries for postgres_exporter (--extend.query-path) exposing rejections, bypassed and "
        "unfenced writes, lateness, drift and fence repairs from fencekit's views, which any "
        "role may read. grafana: a dashboard (import it in Grafana, pick the Prometheus data "
        "source) built on those metrics. See docs/errors-and-metrics.md.",
        epilog="examples:\n"
        "  fencekit monitoring postgres-exporter > /etc/postgres_exporter/fencekit.yaml\n"
        "  fencekit monitoring grafana > fencekit-dashboard.json",
    )
    p.add_argument("file", choices=sorted(FILES), help="which file to print")
    p.set_defaults(func=run_monitoring, prog=p.prog)


def run_monitoring(args: argparse.Namespace) -> int:
    sys.stdout.write(read(FILES[args.file]))
    return 0
