"""``fencekit status``: the installed core, each protected table with its spec, drift and
rejection counts, worst lateness and fence repairs, as text or JSON."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from fencekit import sqlgen
from fencekit.cli.common import FMT, connect, dsn_from, dsn_option

if TYPE_CHECKING:
    from fencekit.catalog import Status

__all__ = ["format_status", "register", "run_status", "status_lines"]


def register(subparsers: Any) -> None:
    """Add ``fencekit status``."""
    p = subparsers.add_parser(
        "status",
        help="protected tables, their spec, drift and rejection counts",
        formatter_class=FMT,
        description="Show the installed core version and each protected table with its spec, "
        "the template version that generated its objects, drift and rejection counts per "
        "reason. Drift: trigger missing, disabled, ENABLE REPLICA (does not fire for ordinary "
        "writes) or ENABLE ALWAYS (fires under session_replication_role = replica), fence "
        "column dropped or not bigint, function body changed, objects from an older template, "
        "partitions and inheritance children without fencekit's triggers (created after "
        "protect), table missing; other triggers that fire before fencekit's checks (or, on a "
        "row-fenced table, can overwrite the fence column); fencekit's own objects owned by "
        "another role than the one that installed it (a restore by an application role), or by "
        "a role that is neither a superuser nor a member of fencekit_admin.\n\nExit status: 0 "
        "when nothing drifted, 1 when anything did (or the core is not installed).",
        epilog='examples:\n  fencekit status --dsn "$DSN"\n  fencekit status --json | jq .\n'
        "  fencekit status --allow-trigger audit_stamp   # reviewed: never touches the token",
    )
    p.add_argument("--json", action="store_true", help="print JSON for machines")
    p.add_argument(
        "--allow-trigger",
        action="append",
        default=[],
        metavar="NAME",
        help="a trigger you have reviewed (it never sets fencekit.token nor the fence column): "
        "do not report it, on any protected table; repeat for several",
    )
    dsn_option(p)
    p.set_defaults(func=run_status, prog=p.prog)


def run_status(args: argparse.Namespace) -> int:
    from fencekit import catalog

    with connect(dsn_from(args)) as conn:
        st = catalog.status(conn, allow_triggers=args.allow_trigger)
    if args.json:
        print(json.dumps(st.as_dict(), indent=2, ensure_ascii=False))
    elif st.core_version is None:
        print(f"fencekit status: error: {st.drift[0].message}", file=sys.stderr)
    else:
        sys.stdout.write(format_status(st))
    return 1 if st.has_drift else 0


def format_status(st: Status) -> str:
    """The human-readable ``fencekit status`` report."""
    from fencekit.catalog import describe

    lines = [
        f"fencekit core version {st.core_version} (this fencekit: core {sqlgen.CORE_VERSION}, "
        f"table template {sqlgen.TEMPLATE_VERSION})"
    ]
    drifted = sum(1 for t in st.tables if t.drift)
    lines.append(
        f"{len(st.tables)} protected table(s), {drifted} with drift"
        if st.tables
        else "no protected tables"
    )
    if st.tables:
        rows = [("TABLE", "FENCE", "TEMPLATE", "STATE", "COUNTED (reason=count)")]
        for t in st.tables:
            counted = ", ".join(f"{r}={n}" for r, n in t.rejections.items() if n) or "-"
            state = f"DRIFT ({len(t.drift)})" if t.drift else "ok"
            rows.append(
                (str(t.spec.table), describe(t.spec), str(t.template_version), state, counted)
            )
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines.append("")
        lines += ["  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4] for r in rows]
    problems = [("fencekit", d) for d in st.drift] + [
        (str(t.spec.table), d) for t in st.tables for d in t.drift
    ]
    lines += status_lines(st)  # worst lateness, fence repairs
    if st.warnings:
        lines += ["", "Warnings (server durability, see docs/leases.md):"]
        lines += [f"  {w}" for w in st.warnings]
    if problems:
        lines += ["", "Drift:"]
        for where, d in problems:
            lines.append(f"  {where}: {d.message} [{d.kind}]")
            fix, *more = d.fix.splitlines()
            lines.append(f"      fix: {fix}")
            lines += [f"           {line}" for line in more]
    return "\n".join(lines) + "\n"


def status_lines(st: Status) -> list[str]:
    """Lines ``fencekit status`` adds: worst lateness per table, recent repairs."""
    lines: list[str] = []
    late = [(t, t.max_lateness_seconds) for t in st.tables if t.max_lateness_seconds is not None]
    if late:
        lines += ["", "Worst lateness of a rejected token (time since the fence passed it):"]
        lines += [f"  {t.spec.table}: {v:.3f} s" for t, v in late]
    r = st.repairs
    if r is not None and r.count:
        lines += ["", f"Repairs: {r.count} ({r.lowered} lowered) in fencekit.repairs"]
        if r.last is not None:
            lines.append(f"  last: {r.last}")
    return lines
