"""``fencekit allow``: record code on protected tables that a DBA has reviewed.

``fencekit status`` reports every trigger, default, constraint, index, policy, rule or column
type on a protected table that runs code fencekit did not generate, each with the sha256 of
what it runs. ``fencekit allow SHA256`` records a hash in ``fencekit.allowed_code`` (writable by
members of fencekit_admin only), and status stops reporting code with that hash: on any table,
under any trigger name, until the code changes.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from fencekit.cli import HelpFormatter
from fencekit.cli.common import connect, dsn_from, dsn_option, emit, json_option
from fencekit.errors import UsageError

__all__: list[str] = []

_SHA = re.compile(r"[0-9a-f]{64}")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "allow",
        help="allow reviewed code on protected tables by its hash (status stops reporting it)",
        formatter_class=HelpFormatter,
        description="`fencekit status` reports each trigger, default, constraint, index, policy, "
        "rule and column type on a protected table that runs code fencekit did not generate, "
        "with the sha256 of the code it runs (a trigger: its function's language, body, "
        "arguments and security mode, the trigger's arguments and WHEN clause; never a name). "
        "Once you have read that code and know it never sets a fencekit.* setting "
        "(fencekit.token, fencekit.issuer ...) nor a row fence's column, allow its "
        "hash: status stops reporting it on every table and under every "
        "name, until the code changes. Only hashes status reports now are accepted. Writes "
        "fencekit.allowed_code, which only members of fencekit_admin may change.",
        epilog="examples:\n"
        "  fencekit status --json | jq -r '.tables[].drift[] | select(.sha256) | .sha256'\n"
        '  fencekit allow 3f1c...e9 --note "audit trigger, reviewed by ops" --dsn "$DSN"\n'
        '  fencekit allow --list --dsn "$DSN"\n'
        '  fencekit allow --revoke 3f1c...e9 --dsn "$DSN"',
    )
    p.add_argument("sha256", nargs="*", help="a code hash from `fencekit status`")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--list", action="store_true", help="print the allowed hashes")
    what.add_argument("--revoke", action="store_true", help="remove the hashes given")
    p.add_argument("--note", help="why the code is safe (kept with the hash)")
    json_option(p)
    dsn_option(p)
    p.set_defaults(func=run_allow, prog=p.prog)


def run_allow(args: argparse.Namespace) -> int:
    from fencekit import catalog

    hashes = [h.lower() for h in args.sha256]
    bad = [h for h in hashes if not _SHA.fullmatch(h)]
    if bad:
        raise UsageError(f"not a sha256 (64 hex digits): {', '.join(bad)}")
    if not args.list and not hashes:
        raise UsageError("give the sha256 of the code to allow (fencekit status prints it)")
    with connect(dsn_from(args)) as conn:
        catalog.require_core(conn)
        if args.list:
            rows = catalog.allowed_code(conn)
            emit(
                args,
                {"allowed": rows},
                [
                    f"{r['sha256']}  {r['object']}  ({r['allowed_by']}, {r['allowed_at']})"
                    + (f"  {r['note']}" if r["note"] else "")
                    for r in rows
                ]
                or ["no code allowed"],
            )
            return 0
        if args.revoke:
            gone = catalog.revoke_code(conn, hashes)
            emit(args, {"revoked": gone}, [f"revoked {h}" for h in gone] or ["nothing revoked"])
            return 0 if len(gone) == len(hashes) else 1
        objects = catalog.allow_code(conn, catalog.status(conn), hashes, args.note)
    emit(args, {"allowed": objects}, [f"allowed {h}: {o}" for h, o in objects.items()])
    return 0
