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

__all__: list[str] = []


def register(subparsers: Any) -> None:
    """Add ``fencekit status``."""
    p = subparsers.add_parser(
        "status",
        help="protected tables, their spec, drift and rejection counts",
        formatter_class=FMT,
        description="Show the installed core version and each protected table with its spec, "
        "the template version that generated its objects, drift and rejection counts per "
        "reason. Drift: fencekit's objects missing, disabled, edited or outdated; partitions "
        "and children without fencekit's triggers; an unprotected table the protected one "
        "inherits from or is a partition of; every trigger, default, generated column, column "
        "type, constraint, index, policy, rule and foreign-key cascade on a protected table "
        "that runs code fencekit did not generate (each with the sha256 of that code, for "
        "`fencekit allow`); roles that may SET session_replication_role; settings that hand "
        "sessions a fencekit.token; fencekit's own objects owned by the wrong role. The DBA "
        "guide lists every kind.\n\nExit status: 0 when nothing drifted, 1 when anything did "
        "(or the core is not installed).",
        epilog='examples:\n  fencekit status --dsn "$DSN"\n  fencekit status --json | jq .\n'
        '  fencekit allow SHA256 --dsn "$DSN"   # reviewed code: status stops reporting it',
    )
    p.add_argument("--json", action="store_true", help="print JSON for machines")
    dsn_option(p)
    p.set_defaults(func=run_status, prog=p.prog)


def run_status(args: argparse.Namespace) -> int:
    from fencekit import catalog
    from fencekit.cli.hints import status_document

    with connect(dsn_from(args)) as conn:
        st = catalog.status(conn)
    if args.json:
        print(json.dumps(status_document(st), indent=2, ensure_ascii=False))
    elif st.core_version is None:
        print(f"fencekit status: error: {st.drift[0].message}", file=sys.stderr)
    else:
        sys.stdout.write(format_status(st))
    return 1 if st.has_drift else 0


def format_status(st: Status) -> str:
    """The human-readable ``fencekit status`` report."""
    from fencekit.cli.hints import fix_text

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
                (str(t.spec.table), t.spec.describe(), str(t.template_version), state, counted)
            )
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines.append("")
        lines += ["  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4] for r in rows]
    problems = [("fencekit", d) for d in st.drift] + [
        (str(t.spec.table), d) for t in st.tables for d in t.drift
    ]
    lines += status_lines(st)  # worst lateness, fence repairs
    if st.warnings:
        lines += ["", "Warnings (see docs/leases.md and docs/security.md):"]
        lines += [f"  {w}" for w in st.warnings]
    if problems:
        lines += ["", "Drift:"]
        for where, d in problems:
            lines.append(f"  {where}: {d.message} [{d.kind}]")
            fix, *more = fix_text(d).splitlines()
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
