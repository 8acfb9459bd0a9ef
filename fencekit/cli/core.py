"""Core subcommands: install, uninstall, sql install|protect|unprotect|rename|uninstall,
protect, unprotect, rename, status.

``fencekit sql ...`` prints SQL and needs no database (``--from-ddl`` validates against schema
files); ``install``, ``protect``, ``unprotect`` and ``status`` connect with ``--dsn`` (or
``FENCEKIT_DSN``) and run exactly the script that ``fencekit sql ...`` prints.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fencekit import sqlgen
from fencekit.cli import HelpFormatter, UsageError
from fencekit.ident import quote_literal
from fencekit.spec import DEFAULT_COLUMN, FenceSpec, Scope, SpecError, TableName

if TYPE_CHECKING:
    import psycopg

    from fencekit.catalog import Status

__all__ = ["register"]

_FMT = HelpFormatter
_LOCK_TIMEOUT = re.compile(r"\d+(\.\d+)?\s*(us|ms|s|min|h|d)?")
_TABLE_HELP = 'the table, written as SQL writes it: billing, public.billing, "My Schema"."My Table"'


def register(subparsers: Any) -> None:
    """Add the core subcommands to ``fencekit``."""
    _install(subparsers)
    _uninstall(subparsers)
    _sql(subparsers)
    _protect(subparsers)
    _unprotect(subparsers)
    _rename(subparsers)
    _auto_cover(subparsers)
    _status(subparsers)


# ------------------------------------------------------------------------------- parsers


def _install(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "install",
        help="install (or upgrade) fencekit's core objects in a database",
        formatter_class=_FMT,
        description="Install fencekit's core (schema fencekit, the fences and registry tables, "
        "the check functions, the rejection counters and the role fencekit_admin) into the "
        "database. Idempotent: re-running it, or running a newer fencekit, upgrades in place "
        "without touching protected tables.\n\nNeeds CREATE on the database (and CREATEROLE "
        "once, unless a DBA created the role fencekit_admin beforehand). With no Python near "
        "the server, use `fencekit sql install` and psql instead.",
        epilog="example:\n  fencekit install --dsn postgresql://app@db.example/billing",
    )
    _dsn_option(p)
    _lock_timeout_option(p)
    p.add_argument(
        "--allow-untested-postgres",
        action="store_true",
        help="install even on a PostgreSQL major version this fencekit is not tested on "
        "(tested: 14 to 18); without it, install refuses such a server and changes nothing",
    )
    _json_option(p)
    p.set_defaults(func=run_install, prog=p.prog)


def _no_transaction_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-transaction",
        dest="transaction",
        action="store_false",
        help="leave out BEGIN/COMMIT and the lock_timeout, to run the statements inside a "
        "transaction someone else opens (a Django RunSQL, a migration tool's transaction)",
    )


def _sql(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "sql",
        help="print reviewable SQL scripts (install, protect, unprotect) for psql",
        formatter_class=_FMT,
        description="Print SQL scripts for a DBA to review and run with psql. No database "
        "connection is needed.",
        epilog="examples:\n"
        "  fencekit sql install > fencekit.sql\n"
        "  fencekit sql protect billing_summary --key account_id > protect.sql\n"
        "  psql -v ON_ERROR_STOP=1 -f protect.sql",
    )
    commands = p.add_subparsers(dest="sql_command", metavar="SCRIPT", required=True)
    inst = commands.add_parser(
        "install",
        help="the core install script",
        formatter_class=_FMT,
        description="Print the core install script (the same SQL `fencekit install` runs; "
        "sql/fencekit-install.sql in the source tree is a copy of it). It runs in one "
        "transaction and is idempotent.",
        epilog="example:\n"
        "  fencekit sql install > fencekit.sql && psql -v ON_ERROR_STOP=1 -f fencekit.sql",
    )
    _lock_timeout_option(inst)
    _no_transaction_option(inst)
    inst.set_defaults(func=run_sql_install, prog=inst.prog)

    prot = commands.add_parser(
        "protect",
        help="the script that protects a table",
        formatter_class=_FMT,
        description="Print the script that protects TABLE: the fence column (row fences), the "
        "check functions and triggers, and the registry row, in one transaction with a "
        "lock_timeout. It adds a nullable column at most (no table rewrite) and is "
        "idempotent.\n\nScopes: row (default; each row carries its fence), key (--key: rows "
        "sharing key values share one fence; --resource shares it across tables), table (one "
        "fence for the whole table).\n\nWith --from-ddl the table and key columns are checked "
        "against CREATE/ALTER TABLE statements in the given files, offline.",
        epilog="examples:\n"
        "  fencekit sql protect billing_summary > protect.sql\n"
        "  fencekit sql protect public.billing_summary --key account_id "
        "--from-ddl schema.sql\n"
        "  fencekit sql protect invoices --key account_id --resource billing\n"
        '  fencekit sql protect \'"My Schema"."Ledger"\' --scope table --on-equal reject',
    )
    prot.add_argument("table", metavar="TABLE", help=_TABLE_HELP)
    _spec_options(prot, from_ddl=True)
    _no_transaction_option(prot)
    prot.set_defaults(func=run_sql_protect, prog=prot.prog)

    unprot = commands.add_parser(
        "unprotect",
        help="the exact undo of `sql protect` for the same options",
        formatter_class=_FMT,
        description="Print the script that removes what `fencekit sql protect` with the same "
        "options created: triggers (also on partitions), functions, the fence column of a row "
        "fence (its fences are lost), counters and the registry row. Pass the options the "
        "table was protected with (`fencekit status` shows them); `fencekit unprotect --dsn` "
        "reads them from the database instead.",
        epilog="example:\n  fencekit sql unprotect billing_summary --key account_id > undo.sql",
    )
    unprot.add_argument("table", metavar="TABLE", help=_TABLE_HELP)
    _spec_options(unprot, from_ddl=True)
    _no_transaction_option(unprot)
    unprot.set_defaults(func=run_sql_unprotect, prog=unprot.prog)
    _sql_rename(commands)
    _sql_uninstall(commands)


def _protect(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "protect",
        help="protect a table in a live database (runs `fencekit sql protect`'s script)",
        formatter_class=_FMT,
        description="Check TABLE in the database (it exists, key columns exist and are NOT "
        "NULL, the fence column is free or bigint, the core is installed), then run the "
        "script `fencekit sql protect` prints for the same options. An unqualified TABLE is "
        "resolved through the server's search_path. Re-running it is a no-op that also "
        "repairs missing triggers and partitions attached since.",
        epilog="examples:\n"
        '  fencekit protect billing_summary --dsn "$DSN"\n'
        "  FENCEKIT_DSN=postgresql:///billing fencekit protect billing_summary --key account_id",
    )
    p.add_argument("table", metavar="TABLE", help=_TABLE_HELP)
    _spec_options(p, from_ddl=False)
    _dsn_option(p)
    _json_option(p)
    p.set_defaults(func=run_protect, prog=p.prog)


def _unprotect(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "unprotect",
        help="remove fencekit's objects from a table in a live database",
        formatter_class=_FMT,
        description="Read the spec and template version TABLE was protected with from "
        "fencekit.protected and run their exact undo (see `fencekit sql unprotect`). A row "
        "fence's column is dropped with the fences it holds.",
        epilog='example:\n  fencekit unprotect billing_summary --dsn "$DSN"',
    )
    p.add_argument("table", metavar="TABLE", help=_TABLE_HELP)
    _lock_timeout_option(p)
    _dsn_option(p)
    _json_option(p)
    p.set_defaults(func=run_unprotect, prog=p.prog)


def _auto_cover(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "auto-cover",
        help="cover partitions and children created after protect, as they are created",
        formatter_class=_FMT,
        description="Protect puts a table's triggers on the partitions and inheritance "
        "children it has when it runs. A child created or attached later is not covered until "
        "protect is re-run (`fencekit status` reports it). `auto-cover on` installs an event "
        "trigger that covers such a child in the transaction that creates it, or refuses to "
        "create it when the creating role may not attach fencekit's triggers. Event triggers "
        "need a superuser (or your provider's equivalent role).",
        epilog="examples:\n  fencekit auto-cover on --dsn postgresql://admin@db/app\n"
        "  fencekit auto-cover off --dsn postgresql://admin@db/app",
    )
    p.add_argument("state", choices=["on", "off"], help="turn auto-cover on or off")
    _dsn_option(p)
    p.set_defaults(func=run_auto_cover, prog=p.prog)


def _status(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "status",
        help="protected tables, their spec, drift and rejection counts",
        formatter_class=_FMT,
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
    _dsn_option(p)
    p.set_defaults(func=run_status, prog=p.prog)


def _dsn_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dsn",
        help="PostgreSQL connection string, e.g. postgresql://user@host/db, or a SQLAlchemy URL "
        "such as postgresql+psycopg://user@host/db (default: $FENCEKIT_DSN)",
    )


def _json_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object on stdout instead of text (keys: docs/reference.md)",
    )


def _lock_timeout_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--lock-timeout",
        default=sqlgen.DEFAULT_LOCK_TIMEOUT,
        metavar="DURATION",
        help="give up instead of queueing behind long transactions for longer than this "
        "(SET LOCAL lock_timeout; e.g. 500ms, 5s, 1min; default: %(default)s)",
    )


def _spec_options(p: argparse.ArgumentParser, *, from_ddl: bool) -> None:
    g = p.add_argument_group("fence spec")
    g.add_argument(
        "--key",
        action="append",
        default=[],
        metavar="COL",
        help="key column (repeat for a composite key); implies --scope key",
    )
    g.add_argument(
        "--scope",
        choices=[s.value for s in Scope],
        help="row: a fence per row (default); key: per key value; table: one for the table",
    )
    g.add_argument(
        "--resource",
        metavar="NAME",
        help="named resource (key/table scope) shared by every table protected with it",
    )
    g.add_argument(
        "--on-missing",
        choices=["reject", "allow"],
        default="reject",
        help="a write with no token: reject it (default) or allow it (counted as unfenced)",
    )
    g.add_argument(
        "--on-equal",
        choices=["accept", "reject"],
        default="accept",
        help="a token equal to the fence: accept (default: the holder writes again) or reject "
        "(each token writes once)",
    )
    g.add_argument(
        "--column",
        default=DEFAULT_COLUMN,
        metavar="NAME",
        help="fence column of a row fence (default: %(default)s)",
    )
    g.add_argument("--issuer", metavar="NAME", help="bind the resource to one token issuer")
    _lock_timeout_option(p)
    if from_ddl:
        p.add_argument(
            "--from-ddl",
            action="append",
            default=[],
            metavar="FILE",
            help="schema file(s) with CREATE/ALTER TABLE statements to validate against, "
            "read in order (repeatable); no database needed",
        )


# ------------------------------------------------------------------------------- helpers


def _dsn(args: argparse.Namespace) -> str:
    dsn = args.dsn or os.environ.get("FENCEKIT_DSN")
    if not dsn:
        raise UsageError("--dsn is required (or set FENCEKIT_DSN)")
    return libpq_dsn(str(dsn))


_SQLALCHEMY_URL = re.compile(r"(?i)^(postgres(?:ql)?)(\+[a-z0-9_]+)?://")
_OTHER_URL = re.compile(r"(?i)^([a-z][a-z0-9_]*)(\+[a-z0-9_]+)?://")


def libpq_dsn(dsn: str) -> str:
    """``dsn`` as libpq takes it: a SQLAlchemy URL (``postgresql+psycopg://...``, as alembic's
    ``sqlalchemy.url`` holds it) loses its driver suffix; other databases are refused."""
    if _SQLALCHEMY_URL.match(dsn):
        return _SQLALCHEMY_URL.sub("postgresql://", dsn, count=1)
    other = _OTHER_URL.match(dsn)
    if other:
        raise UsageError(
            f"--dsn {other.group(0)}... is not a PostgreSQL URL; use postgresql://... "
            "(or postgresql+psycopg://...)"
        )
    return dsn


def _emit(args: argparse.Namespace, document: dict[str, Any], text: list[str]) -> None:
    """Print ``document`` as JSON with --json, else the text lines."""
    if getattr(args, "json", False):
        print(json.dumps(document, indent=2, ensure_ascii=False, sort_keys=True))
    else:
        for line in text:
            print(line)


def _lock_timeout(args: argparse.Namespace) -> str:
    value = str(args.lock_timeout).strip()
    if not _LOCK_TIMEOUT.fullmatch(value):
        raise UsageError(
            f"--lock-timeout {args.lock_timeout!r} is not a duration like 500ms, 5s or 1min"
        )
    return value


def _table(text: str) -> TableName:
    try:
        return TableName.parse(text)
    except SpecError as exc:
        raise UsageError(str(exc)) from None


def _spec(args: argparse.Namespace, table: TableName) -> FenceSpec:
    scope = args.scope or ("key" if args.key else "row")
    try:
        return FenceSpec(
            table=table,
            scope=Scope(scope),
            key=tuple(args.key),
            resource=args.resource,
            on_missing=args.on_missing,
            on_equal=args.on_equal,
            column=args.column,
            issuer=args.issuer,
        )
    except SpecError as exc:
        raise UsageError(str(exc)) from None


def _note(args: argparse.Namespace, text: str) -> None:
    print(f"{args.prog}: note: {text}", file=sys.stderr)


def _offline_check(args: argparse.Namespace, spec: FenceSpec) -> None:
    if not args.from_ddl:
        return
    from fencekit import ddl

    for note in ddl.validate(spec, ddl.read_ddl(args.from_ddl)):
        _note(args, note)


def _connect(dsn: str) -> psycopg.Connection[Any]:
    import psycopg

    return psycopg.connect(dsn, autocommit=True)


def _run_script(conn: psycopg.Connection[Any], script: str, lock_timeout: str) -> None:
    """Run a generated psql script as is (its own BEGIN/COMMIT) in one simple query."""
    import psycopg

    from fencekit.catalog import CatalogError

    try:
        conn.execute(script.encode())  # bytes and no params: simple protocol, no % parsing
    except psycopg.errors.LockNotAvailable as exc:
        raise CatalogError(
            f"gave up waiting for a lock after lock_timeout {lock_timeout} (a long transaction "
            "holds one on the table); nothing was changed. Retry when it ends, or pass a "
            "longer --lock-timeout"
        ) from exc


# ------------------------------------------------------------------------------- handlers


def run_sql_install(args: argparse.Namespace) -> int:
    script = sqlgen.render_install(lock_timeout=_lock_timeout(args), transaction=args.transaction)
    sys.stdout.write(script)
    return 0


def _print_table_script(args: argparse.Namespace, render: Callable[..., str]) -> int:
    spec = _spec(args, _table(args.table))
    _offline_check(args, spec)
    script = render(spec, lock_timeout=_lock_timeout(args), transaction=args.transaction)
    sys.stdout.write(script)
    return 0


def run_sql_protect(args: argparse.Namespace) -> int:
    return _print_table_script(args, sqlgen.render_protect)


def run_sql_unprotect(args: argparse.Namespace) -> int:
    return _print_table_script(args, sqlgen.render_unprotect)


def run_install(args: argparse.Namespace) -> int:
    from fencekit.catalog import core_version, protected_tables

    dsn, lock_timeout = _dsn(args), _lock_timeout(args)
    with _connect(dsn) as conn:
        before = core_version(conn)
        # Tables protected by another generation of per-table objects are re-protected in the
        # same transaction as the core upgrade: their old functions may call core functions the
        # upgrade replaced, so they must never run against the new core.
        outdated = (
            []
            if before is None
            else [
                pt.spec
                for pt in protected_tables(conn)
                if pt.template_version != sqlgen.TEMPLATE_VERSION
            ]
        )
        conn.rollback()
        statements = sqlgen.install_statements()
        for spec in outdated:
            statements += sqlgen.protect_statements(spec)
        # fencekit.check_postgres_version (core) reads this setting.
        untested = (
            "SET LOCAL fencekit.allow_untested_postgres = on;\n"
            if getattr(args, "allow_untested_postgres", False)
            else ""
        )
        script = (
            f"BEGIN;\nSET LOCAL lock_timeout = {quote_literal(lock_timeout)};\n{untested}"
            + ";\n".join(s.rstrip().rstrip(";") for s in statements)
            + ";\nCOMMIT;\n"
        )
        _run_script(conn, script, lock_timeout)
        after = core_version(conn)
    if before is None:
        text = [f"installed fencekit core version {after}"]
    elif before == after:
        text = [f"fencekit core version {after} was already installed; re-applied (no changes)"]
    else:
        text = [f"upgraded fencekit core from version {before} to {after}"]
    text += [
        f"re-protected {spec.table} with template {sqlgen.TEMPLATE_VERSION}" for spec in outdated
    ]
    document = {
        "action": "install",
        "core_version_before": before,
        "core_version": after,
        "template_version": sqlgen.TEMPLATE_VERSION,
        "reprotected": [spec.table.dotted for spec in outdated],
    }
    _emit(args, document, text)
    return 0


def run_protect(args: argparse.Namespace) -> int:
    from fencekit import catalog

    dsn, lock_timeout = _dsn(args), _lock_timeout(args)
    _spec(args, _table(args.table))  # usage errors before connecting
    with _connect(dsn) as conn:
        catalog.require_core(conn)
        spec = _spec(args, catalog.existing_table(conn, args.table))
        notes = catalog.check_spec(conn, spec)
        script = sqlgen.render_protect(spec, lock_timeout=lock_timeout)
        _run_script(conn, script, lock_timeout)
    document = {
        "action": "protect",
        **_table_keys(spec),
        "template_version": sqlgen.TEMPLATE_VERSION,
        "notes": notes,
    }
    text = [
        f"protected {spec.table} ({catalog.describe(spec)}, template {sqlgen.TEMPLATE_VERSION})"
    ]
    _emit(args, document, text)
    if not args.json:
        for note in notes:
            _note(args, note)
    return 0


def _table_keys(spec: FenceSpec) -> dict[str, Any]:
    """The keys every --json document about one table has."""
    return {
        "table": spec.table.dotted,
        "schema": spec.table.schema,
        "name": spec.table.name,
        "spec": spec.to_dict(),
    }


def run_unprotect(args: argparse.Namespace) -> int:
    from fencekit import catalog

    dsn, lock_timeout = _dsn(args), _lock_timeout(args)
    _table(args.table)
    with _connect(dsn) as conn:
        if catalog.core_version(conn) is None:
            catalog.require_core(conn)
        pt = catalog.protected_table(conn, args.table, "fencekit.protected has no row for it")
        script = sqlgen.render_unprotect(pt.spec, lock_timeout=lock_timeout)
        _run_script(conn, script, lock_timeout)
    document = {
        "action": "unprotect",
        **_table_keys(pt.spec),
        "template_version": pt.template_version,
    }
    _emit(args, document, [f"unprotected {pt.spec.table} (was: {catalog.describe(pt.spec)})"])
    return 0


def run_auto_cover(args: argparse.Namespace) -> int:
    from fencekit import catalog

    with _connect(_dsn(args)) as conn:
        catalog.require_core(conn)
        conn.execute("SELECT fencekit.set_auto_cover(%s)", [args.state == "on"])
        conn.commit()
    print(f"auto-cover is {args.state}")
    return 0


def run_status(args: argparse.Namespace) -> int:
    from fencekit import catalog

    with _connect(_dsn(args)) as conn:
        st = catalog.status(conn, allow_triggers=args.allow_trigger)
    if args.json:
        print(json.dumps(st.to_dict(), indent=2, ensure_ascii=False))
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
    from fencekit.cli.fences import status_lines

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


# ------------------------------------------------------------------------------- rename


def _rename(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "rename",
        help="move a protection to its table's new name after ALTER TABLE ... RENAME",
        formatter_class=_FMT,
        description="After `ALTER TABLE OLD RENAME TO NEW` (or alembic's op.rename_table) the "
        "table's triggers keep checking writes, but the registry still names OLD, the "
        "triggers and functions are named after OLD and an unnamed key or table fence's "
        "resource is OLD's name; `fencekit status` reports the table as renamed. This moves the "
        "protection to NEW in one transaction (the table is never unchecked): registry row, "
        "triggers and functions (named after NEW), rejection counters, and the fences of an "
        "unnamed key or table fence. It refuses unless NEW carries OLD's triggers.",
        epilog="example:\n  psql -c 'ALTER TABLE billing RENAME TO invoices'\n"
        '  fencekit rename billing invoices --dsn "$DSN"',
    )
    p.add_argument("old", metavar="OLD", help="the name the table was protected under")
    p.add_argument("new", metavar="NEW", help="its name now (same schema as OLD by default)")
    _lock_timeout_option(p)
    _dsn_option(p)
    _json_option(p)
    p.set_defaults(func=run_rename, prog=p.prog)


def _sql_rename(commands: Any) -> None:
    p = commands.add_parser(
        "rename",
        help="the script that moves a protection to a renamed table's new name",
        formatter_class=_FMT,
        description="Print the script `fencekit rename` runs: after `ALTER TABLE OLD RENAME TO "
        "NEW`, move OLD's protection (registry row, triggers and functions, counters, an "
        "unnamed key or table fence's fences) to NEW in one transaction. Pass the options OLD "
        "was protected with (`fencekit status` shows them); the script refuses to run when "
        "the registry holds another spec, naming the right command.",
        epilog="example:\n  fencekit sql rename billing invoices --key account_id > rename.sql",
    )
    p.add_argument("table", metavar="OLD", help="the name the table was protected under")
    p.add_argument("new", metavar="NEW", help="its name now (same schema as OLD by default)")
    _spec_options(p, from_ddl=False)
    p.set_defaults(func=run_sql_rename, prog=p.prog)


def _new_name(old: TableName, text: str) -> TableName:
    """NEW as written; unqualified, it stays in OLD's schema (RENAME keeps the schema)."""
    try:
        return TableName.parse(text, default_schema=old.schema)
    except SpecError as exc:
        raise UsageError(str(exc)) from None


def run_sql_rename(args: argparse.Namespace) -> int:
    old = _table(args.table)
    spec = _spec(args, old)
    new = _new_name(old, args.new)
    if new == old:
        raise UsageError(f"OLD and NEW are the same table ({old})")
    sys.stdout.write(sqlgen.render_rename(spec, new, lock_timeout=_lock_timeout(args)))
    return 0


def run_rename(args: argparse.Namespace) -> int:
    from fencekit import catalog

    dsn, lock_timeout = _dsn(args), _lock_timeout(args)
    old = _table(args.old)
    with _connect(dsn) as conn:
        catalog.require_core(conn)
        found = catalog.resolve_table(conn, args.new)
        if found is None:
            raise catalog.CatalogError(
                f"table {args.new} does not exist (search_path: {catalog.search_path(conn)}); "
                f"rename the table first: ALTER TABLE {old} RENAME TO ..."
            )
        new = found[0]
        # Unqualified OLD: the schema NEW is in (ALTER TABLE ... RENAME keeps the schema).
        old = TableName.parse(args.old, default_schema=new.schema)
        pt = catalog.registered(conn, old)
        if pt is None:
            raise catalog.CatalogError(
                f"{old} is not protected (fencekit.protected has no row for it)"
            )
        if new == old:
            raise catalog.CatalogError(f"{old} still exists under that name: nothing to rename")
        script = sqlgen.render_rename(pt.spec, new, lock_timeout=lock_timeout)
        _run_script(conn, script, lock_timeout)
    spec = pt.spec.with_changes(table=new)
    document = {
        "action": "rename",
        "old": _table_keys(pt.spec),
        **_table_keys(spec),
        "template_version": sqlgen.TEMPLATE_VERSION,
    }
    _emit(args, document, [f"renamed the protection of {old} to {new} ({catalog.describe(spec)})"])
    return 0


# ------------------------------------------------------------------------------- uninstall


def _uninstall(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "uninstall",
        help="remove fencekit from a database (refuses while tables are protected)",
        formatter_class=_FMT,
        description="Drop the schema fencekit: the registry, the fences, the counters, the "
        "leases and every check function. Refuses while tables are protected (nothing is "
        "changed) unless --unprotect-all: then each protected table is first unprotected "
        "exactly as `fencekit unprotect` would (triggers dropped, a row fence's column "
        "dropped with its fences), all in one transaction. The roles fencekit_admin and "
        "fencekit_writer stay (roles belong to the whole server). If auto-cover is on, "
        "removing its event trigger needs a superuser.",
        epilog='examples:\n  fencekit uninstall --dsn "$DSN"\n'
        '  fencekit uninstall --unprotect-all --dsn "$DSN"',
    )
    p.add_argument(
        "--unprotect-all",
        action="store_true",
        help="unprotect every protected table first (their fences are lost)",
    )
    _lock_timeout_option(p)
    _dsn_option(p)
    _json_option(p)
    p.set_defaults(func=run_uninstall, prog=p.prog)


def _sql_uninstall(commands: Any) -> None:
    p = commands.add_parser(
        "uninstall",
        help="the script that removes fencekit from a database",
        formatter_class=_FMT,
        description="Print the script `fencekit uninstall` runs. It refuses while tables are "
        "protected, unless --unprotect-all: then it first removes, for every table in "
        "fencekit.protected, its fencekit triggers (also on partitions and children) and a "
        "row fence's column, with the fences they hold.",
        epilog="example:\n  fencekit sql uninstall > uninstall.sql && "
        "psql -v ON_ERROR_STOP=1 -f uninstall.sql",
    )
    p.add_argument(
        "--unprotect-all",
        action="store_true",
        help="unprotect every protected table first (their fences are lost)",
    )
    _lock_timeout_option(p)
    p.set_defaults(func=run_sql_uninstall, prog=p.prog)


def run_sql_uninstall(args: argparse.Namespace) -> int:
    script = sqlgen.render_uninstall(
        unprotect_all=args.unprotect_all, lock_timeout=_lock_timeout(args)
    )
    sys.stdout.write(script)
    return 0


def run_uninstall(args: argparse.Namespace) -> int:
    from fencekit import catalog

    dsn, lock_timeout = _dsn(args), _lock_timeout(args)
    with _connect(dsn) as conn:
        before = catalog.core_version(conn)
        if before is None:
            _emit(
                args,
                {"action": "uninstall", "core_version_before": None, "unprotected": []},
                ["fencekit is not installed in this database; nothing to remove"],
            )
            return 0
        tables = catalog.protected_tables(conn)
        if tables and not args.unprotect_all:
            names = ", ".join(str(pt.spec.table) for pt in tables)
            raise catalog.CatalogError(
                f"{len(tables)} table(s) are still protected ({names}); nothing was removed. "
                "Unprotect them (fencekit unprotect TABLE), or pass --unprotect-all to "
                "unprotect them in the same transaction (their fences are lost)"
            )
        specs = [pt.spec for pt in tables]
        script = sqlgen.render_uninstall(specs, lock_timeout=lock_timeout)
        _run_script(conn, script, lock_timeout)
    document = {
        "action": "uninstall",
        "core_version_before": before,
        "unprotected": [spec.table.dotted for spec in specs],
    }
    text = [f"unprotected {spec.table}" for spec in specs]
    text.append(
        f"removed fencekit (core version {before}); roles fencekit_admin and fencekit_writer remain"
    )
    _emit(args, document, text)
    return 0


# ------------------------------------------------------------------------------- --version


def version_report(dsn: str | None) -> dict[str, Any]:
    """What ``fencekit --version`` reports: this package, and with a DSN the core installed in
    that database and the templates its protected tables were generated by."""
    from fencekit import __version__

    report: dict[str, Any] = {
        "package": __version__,
        "core_version": sqlgen.CORE_VERSION,
        "template_version": sqlgen.TEMPLATE_VERSION,
    }
    if dsn is None:
        return report
    from fencekit import catalog

    with _connect(libpq_dsn(dsn)) as conn:
        installed = catalog.core_version(conn)
        templates: dict[str, int] = {}
        if installed is not None:
            for pt in catalog.protected_tables(conn):
                key = str(pt.template_version)
                templates[key] = templates.get(key, 0) + 1
    report["database"] = {"core_version": installed, "templates": templates}
    return report


def format_version(report: dict[str, Any]) -> str:
    lines = [
        f"fencekit {report['package']} (core {report['core_version']}, table template "
        f"{report['template_version']})"
    ]
    db = report.get("database")
    if db is not None:
        if db["core_version"] is None:
            lines.append("database: fencekit is not installed")
        else:
            used = ", ".join(
                f"template {t}: {n} table(s)" for t, n in sorted(db["templates"].items())
            )
            lines.append(f"database: core {db['core_version']}; " + (used or "no protected tables"))
    return "\n".join(lines) + "\n"
