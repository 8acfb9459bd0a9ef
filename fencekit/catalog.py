"""Read a live database: installed core version, protected tables, drift, rejection counts.

What *should* exist comes from :func:`fencekit.sqlgen.table_objects` for the spec and template
version stored in ``fencekit.protected``; this module only compares it with ``pg_catalog``. It
never writes. Everything it reads is readable by any role that can connect (the registry and
the rejections view are granted to PUBLIC).
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg

from fencekit import sqlgen
from fencekit.ident import quote_ident, quote_literal
from fencekit.spec import DEFAULT_COLUMN, FenceSpec, Scope, SpecError, TableName

__all__ = [
    "CatalogError",
    "Drift",
    "ProtectedTable",
    "Status",
    "check_spec",
    "core_version",
    "protected_tables",
    "registered",
    "resolve_table",
    "status",
]

Conn = psycopg.Connection[Any]

_STAMP_SHA = re.compile(r"\bsha256=([0-9a-f]{64})\b")

# pg_trigger.tgenabled: O = fires in origin/local mode (normal), D = disabled,
# R = fires only under session_replication_role = replica, A = fires always.
_ENABLED = {
    "D": (
        "trigger_disabled",
        "is disabled: writes are not checked",
        "ALTER TABLE {table} ENABLE TRIGGER {trigger}",
    ),
    "R": (
        "trigger_replica_only",
        "is ENABLE REPLICA: it fires only under session_replication_role = replica, so ordinary "
        "writes are not checked",
        "ALTER TABLE {table} ENABLE TRIGGER {trigger}",
    ),
    "A": (
        "trigger_always",
        "is ENABLE ALWAYS: it also fires under session_replication_role = replica (logical "
        "replication apply, restore tools), whose writes carry no token and will be rejected",
        "ALTER TABLE {table} ENABLE TRIGGER {trigger}",
    ),
}


class CatalogError(Exception):
    """The database does not fit the request (core missing, table missing, bad key column)."""


@dataclass(frozen=True)
class Drift:
    """One way a protected table differs from what its spec and template generate."""

    kind: str
    object: str
    message: str
    fix: str

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "object": self.object, "message": self.message, "fix": self.fix}


@dataclass
class ProtectedTable:
    spec: FenceSpec
    template_version: int
    tag: str
    protected_at: datetime | None
    drift: list[Drift] = field(default_factory=list)
    rejections: dict[str, int] = field(default_factory=dict)
    last_rejected_at: datetime | None = None
    max_token_gap: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.spec.table.dotted,
            "schema": self.spec.table.schema,
            "name": self.spec.table.name,
            "spec": self.spec.to_dict(),
            "template_version": self.template_version,
            "tag": self.tag,
            "protected_at": _iso(self.protected_at),
            "drift": [d.to_dict() for d in self.drift],
            "rejections": dict(self.rejections),
            "last_rejected_at": _iso(self.last_rejected_at),
            "max_token_gap": self.max_token_gap,
        }


@dataclass
class Status:
    core_version: int | None
    tables: list[ProtectedTable]
    drift: list[Drift] = field(default_factory=list)  # database-wide (core outdated)
    # Server settings that weaken the lease tokens' guarantee; warnings, not drift.
    warnings: list[str] = field(default_factory=list)

    @property
    def has_drift(self) -> bool:
        return bool(self.drift) or any(t.drift for t in self.tables)

    def to_dict(self) -> dict[str, Any]:
        return {
            "core": {
                "installed": self.core_version is not None,
                "version": self.core_version,
                "latest": sqlgen.CORE_VERSION,
            },
            "template_version": sqlgen.TEMPLATE_VERSION,
            "drift": self.has_drift,
            "core_drift": [d.to_dict() for d in self.drift],
            "warnings": list(self.warnings),
            "tables": [t.to_dict() for t in self.tables],
        }


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


# ------------------------------------------------------------------------------- core, registry


def core_version(conn: Conn) -> int | None:
    """The installed core version, or None when fencekit's core is not installed."""
    row = conn.execute("SELECT pg_catalog.to_regclass('fencekit.meta') IS NOT NULL").fetchone()
    if not row or not row[0]:
        return None
    found = conn.execute("SELECT value FROM fencekit.meta WHERE key = 'core_version'").fetchone()
    if found is None:
        return None
    try:
        return int(found[0])
    except ValueError:
        return None


def require_core(conn: Conn) -> int:
    """The installed core version; :class:`CatalogError` telling how to install it if absent."""
    version = core_version(conn)
    if version is None:
        raise CatalogError(
            "fencekit's core is not installed in this database: run `fencekit install --dsn DSN` "
            "(or, as a DBA: psql -v ON_ERROR_STOP=1 -f sql/fencekit-install.sql)"
        )
    if version < sqlgen.CORE_VERSION:
        raise CatalogError(
            f"fencekit's core in this database is version {version}, older than this fencekit's "
            f"{sqlgen.CORE_VERSION}: run `fencekit install --dsn DSN` to upgrade it in place"
        )
    return version


def _registry_rows(conn: Conn, where: str = "", params: tuple[Any, ...] = ()) -> list[Any]:
    return conn.execute(
        "SELECT schema_name, table_name, tag, spec, template_version, protected_at "
        f"FROM fencekit.protected {where} ORDER BY schema_name, table_name",
        params,
    ).fetchall()


def protected_tables(conn: Conn) -> list[ProtectedTable]:
    """Every table in the registry, with the spec and template version it was protected with."""
    out = []
    for schema, name, tag, spec, tv, at in _registry_rows(conn):
        try:
            parsed = FenceSpec.from_dict(spec)
        except SpecError:
            # Keep the row visible; status reports it.
            parsed = FenceSpec(TableName(schema, name))
        out.append(ProtectedTable(parsed, int(tv), tag, at))
    return out


def registered(conn: Conn, table: TableName) -> ProtectedTable | None:
    """The registry entry of ``table``, or None when it is not protected."""
    rows = _registry_rows(
        conn, "WHERE schema_name = %s AND table_name = %s", (table.schema, table.name)
    )
    if not rows:
        return None
    _, _, tag, spec, tv, at = rows[0]
    return ProtectedTable(FenceSpec.from_dict(spec), int(tv), tag, at)


# ------------------------------------------------------------------------------- tables


def resolve_table(conn: Conn, text: str) -> tuple[TableName, str] | None:
    """Resolve ``text`` as SQL would (the server's search_path for an unqualified name).

    Returns the table's real name and ``relkind``, or None when no such relation exists.
    """
    TableName.parse(text)  # raises SpecError with a clear message on a malformed name
    row = conn.execute(
        "SELECT n.nspname, c.relname, c.relkind::text FROM pg_catalog.pg_class c "
        "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.oid = pg_catalog.to_regclass(%s)",
        (text,),
    ).fetchone()
    if row is None:
        return None
    return TableName(row[0], row[1]), row[2]


def search_path(conn: Conn) -> str:
    row = conn.execute("SELECT pg_catalog.current_setting('search_path')").fetchone()
    return str(row[0]) if row else ""


def check_spec(conn: Conn, spec: FenceSpec) -> list[str]:
    """Validate ``spec`` against the live catalog; return notes for the user.

    Raises :class:`CatalogError`: the table does not exist or is not a table, is a partition,
    a key column is missing or nullable, or the fence column exists with another type.
    """
    t = spec.table
    row = conn.execute(
        "SELECT c.oid, c.relkind::text, c.relispartition FROM pg_catalog.pg_class c "
        "WHERE c.oid = pg_catalog.to_regclass(%s)",
        (t.sql,),
    ).fetchone()
    if row is None:
        raise CatalogError(f"table {t} does not exist")
    oid, relkind, is_partition = row
    if relkind not in ("r", "p"):
        kinds = {"v": "a view", "m": "a materialized view", "f": "a foreign table"}
        raise CatalogError(
            f"{t} is {kinds.get(relkind, f'not a table (relkind {relkind})')}: fencekit protects "
            "tables; protect the table(s) it writes to"
        )
    if is_partition:
        parent = conn.execute(
            "SELECT inhparent::pg_catalog.regclass::text FROM pg_catalog.pg_inherits "
            "WHERE inhrelid = %s",
            (oid,),
        ).fetchone()
        raise CatalogError(
            f"{t} is a partition of {parent[0] if parent else 'another table'}: protect the "
            "partitioned table instead (its partitions are covered)"
        )
    cols = {
        name: (typ, notnull)
        for name, typ, notnull in conn.execute(
            "SELECT attname, atttypid::pg_catalog.regtype::text, attnotnull "
            "FROM pg_catalog.pg_attribute WHERE attrelid = %s AND attnum > 0 "
            "AND NOT attisdropped ORDER BY attnum",
            (oid,),
        ).fetchall()
    }
    for key in spec.key:
        if key not in cols:
            raise CatalogError(
                f"table {t} has no column {key!r} for the key (columns: {', '.join(cols)})"
            )
        if not cols[key][1]:
            raise CatalogError(
                f"key column {key!r} of {t} is nullable; key columns must be NOT NULL "
                f"(ALTER TABLE {t} ALTER COLUMN {quote_ident(key)} SET NOT NULL)"
            )
    notes: list[str] = []
    if spec.scope is Scope.ROW and spec.column in cols:
        typ = cols[spec.column][0]
        if typ != "bigint":
            raise CatalogError(
                f"column {spec.column!r} of {t} already exists with type {typ}, not bigint; "
                "choose another fence column name with --column"
            )
    if relkind == "p":
        parts = conn.execute(
            "SELECT count(*) FROM pg_catalog.pg_partition_tree(%s) WHERE relid <> %s::oid",
            (oid, oid),
        ).fetchone()
        notes.append(
            f"{t} is partitioned: its {parts[0] if parts else 0} existing partition(s) get "
            "fencekit's statement triggers too; re-run protect after attaching new partitions "
            "(`fencekit status` reports partitions without them)"
        )
    current = registered(conn, t)
    if current is not None and current.spec != spec:
        raise CatalogError(
            f"{t} is already protected with another spec "
            f"({describe(current.spec)}); changing a spec in place is not supported: "
            f"run `fencekit unprotect {t}` first (a row fence's column and fences are dropped)"
        )
    return notes


def describe(spec: FenceSpec) -> str:
    """A short human description of a spec, for tables and messages."""
    parts = [f"{spec.scope} fence"]
    if spec.scope is Scope.KEY:
        parts.append(f"key ({', '.join(spec.key)})")
    if spec.scope is Scope.ROW:
        parts.append(f"column {spec.column}")
    if spec.resource is not None:
        parts.append(f"resource {spec.resource}")
    if spec.issuer is not None:
        parts.append(f"issuer {spec.issuer}")
    if spec.on_missing != "reject":
        parts.append(f"on_missing={spec.on_missing}")
    if spec.on_equal != "accept":
        parts.append(f"on_equal={spec.on_equal}")
    return ", ".join(parts)


# ------------------------------------------------------------------------------- drift


def status(conn: Conn) -> Status:
    """Everything ``fencekit status`` shows (``core_missing`` drift without the core)."""
    version = core_version(conn)
    if version is None:
        missing = Drift(
            "core_missing",
            "fencekit",
            "fencekit's core is not installed in this database",
            "fencekit install --dsn DSN (or psql -v ON_ERROR_STOP=1 -f fencekit-install.sql)",
        )
        return Status(None, [], [missing])
    core_drift: list[Drift] = []
    if version < sqlgen.CORE_VERSION:
        core_drift.append(
            Drift(
                "core_outdated",
                "fencekit",
                f"the core is version {version}; this fencekit installs {sqlgen.CORE_VERSION}",
                "fencekit install --dsn DSN (upgrades in place)",
            )
        )
    tables = protected_tables(conn)
    for pt in tables:
        pt.drift = table_drift(conn, pt)
    _add_rejections(conn, tables)
    return Status(version, tables, core_drift, durability_warnings(conn))


def durability_warnings(conn: Conn) -> list[str]:
    """Why this server could hand out a lease token again after a crash or failover.

    Tokens are durable as committed rows are: lost with fsync off, and on a failover to an
    asynchronous standby that had not received the last grants. ``sync_state`` is visible only
    to superusers and pg_read_all_stats; for other roles every standby looks asynchronous.
    """
    row = conn.execute(
        """SELECT pg_catalog.current_setting('fsync')::boolean,
                  pg_catalog.current_setting('synchronous_commit'),
                  (SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_replication r
                    WHERE r.sync_state IS DISTINCT FROM 'sync'
                      AND r.sync_state IS DISTINCT FROM 'quorum'
                      AND NOT EXISTS (SELECT FROM pg_catalog.pg_replication_slots s
                                       WHERE s.active_pid = r.pid AND s.slot_type = 'logical'))"""
    ).fetchone()
    if row is None:
        return []
    fsync, sync_commit, async_standbys = row
    out: list[str] = []
    if not fsync:
        out.append(
            "fsync is off: a crash can lose committed lease grants, and the same token could "
            "be issued twice (fencekit's lease functions cannot protect against that)"
        )
    if async_standbys:
        out.append(
            f"{async_standbys} asynchronous standby(s): after a failover to one of them, lease "
            "grants it had not received are forgotten and tokens can repeat; list them in "
            "synchronous_standby_names (see docs/leases.md)"
        )
    if sync_commit in ("off", "local") and async_standbys:
        out.append(
            f"synchronous_commit = {sync_commit}: commits do not wait for standbys; fencekit's "
            "lease functions raise it for their own transactions, other writes are not covered"
        )
    return out


def table_drift(conn: Conn, pt: ProtectedTable) -> list[Drift]:
    """How ``pt``'s objects in the database differ from what its spec and template generate."""
    t = pt.spec.table
    reprotect = f"fencekit protect {_cli_spec(pt.spec)} --dsn DSN (re-creates what is missing)"
    try:
        objs = sqlgen.table_objects(pt.spec, pt.template_version)
    except ValueError as exc:
        return [Drift("template_unknown", t.dotted, str(exc), "upgrade fencekit")]
    out: list[Drift] = []
    row = conn.execute(
        "SELECT c.oid, c.relkind::text FROM pg_catalog.pg_class c "
        "WHERE c.oid = pg_catalog.to_regclass(%s)",
        (t.sql,),
    ).fetchone()
    if row is None:
        moved = conn.execute(
            "SELECT tgrelid::pg_catalog.regclass::text FROM pg_catalog.pg_trigger "
            "WHERE tgname = %s LIMIT 1",
            (objs.triggers[0].name,),
        ).fetchone()
        where = (
            f"; its triggers are now on {moved[0]} (renamed?)" if moved else " (dropped or renamed)"
        )
        return [
            Drift(
                "table_missing",
                t.dotted,
                f"table {t} no longer exists{where}",
                "rename it back, or unprotect it under its new name after updating the "
                "registry; a dropped table: DELETE FROM fencekit.protected WHERE schema_name = "
                f"{quote_literal(t.schema)} AND table_name = {quote_literal(t.name)} "
                "(as a member of fencekit_admin)",
            )
        ]
    oid, relkind = row
    if pt.template_version < sqlgen.TEMPLATE_VERSION:
        out.append(
            Drift(
                "template_outdated",
                t.dotted,
                f"objects generated by template {pt.template_version}; this fencekit generates "
                f"template {sqlgen.TEMPLATE_VERSION}",
                reprotect,
            )
        )
    out += _trigger_drift(conn, oid, t.sql, t.dotted, objs.triggers, reprotect)
    out += _function_drift(conn, objs.functions, reprotect)
    if pt.spec.scope is Scope.ROW:
        out += _column_drift(conn, oid, pt.spec)
    if relkind == "p":
        out += _partition_drift(conn, oid, objs.triggers, reprotect)
    return out


def _triggers_of(conn: Conn, oid: int) -> dict[str, tuple[str, str]]:
    """name -> (tgenabled, function as schema.name) of a relation's user triggers."""
    return {
        name: (enabled, func)
        for name, enabled, func in conn.execute(
            "SELECT t.tgname, t.tgenabled::text, n.nspname || '.' || p.proname "
            "FROM pg_catalog.pg_trigger t "
            "JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid "
            "JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace "
            "WHERE t.tgrelid = %s AND NOT t.tgisinternal",
            (oid,),
        ).fetchall()
    }


def _trigger_drift(
    conn: Conn,
    oid: int,
    table_sql: str,
    label: str,
    triggers: tuple[sqlgen.Trigger, ...],
    reprotect: str,
    only: set[str] | None = None,
) -> list[Drift]:
    present = _triggers_of(conn, oid)
    out: list[Drift] = []
    for tr in triggers:
        if only is not None and tr.name not in only:
            continue
        obj = f"{label}: trigger {tr.name}"
        found = present.get(tr.name)
        if found is None:
            out.append(Drift("trigger_missing", obj, f"trigger {tr.name} is missing", reprotect))
            continue
        enabled, func = found
        if enabled in _ENABLED:
            kind, what, fix = _ENABLED[enabled]
            out.append(
                Drift(
                    kind,
                    obj,
                    f"trigger {tr.name} {what}",
                    fix.format(table=table_sql, trigger=quote_ident(tr.name)),
                )
            )
        if func != f"fencekit.{tr.function.name}":
            out.append(
                Drift(
                    "trigger_changed",
                    obj,
                    f"trigger {tr.name} calls {func}, not fencekit.{tr.function.name}",
                    f"DROP TRIGGER {quote_ident(tr.name)} ON {table_sql}; then {reprotect}",
                )
            )
    return out


def _function_drift(
    conn: Conn, functions: tuple[sqlgen.Function, ...], reprotect: str
) -> list[Drift]:
    out: list[Drift] = []
    seen: set[str] = set()
    for f in functions:
        if f.name in seen:
            continue
        seen.add(f.name)
        row = conn.execute(
            "SELECT p.prosrc, pg_catalog.obj_description(p.oid, 'pg_proc') "
            "FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = 'fencekit' AND p.proname = %s AND p.pronargs = 0",
            (f.name,),
        ).fetchone()
        obj = f"function {f.sql_name}()"
        if row is None:
            out.append(Drift("function_missing", obj, f"{obj} is missing", reprotect))
            continue
        src, comment = row
        actual = hashlib.sha256(str(src).encode()).hexdigest()
        m = _STAMP_SHA.search(comment or "")
        if m is None or m.group(1) != actual:
            out.append(
                Drift(
                    "function_changed",
                    obj,
                    f"the body of {obj} was changed after fencekit generated it "
                    "(its sha256 does not match the stamp in its comment)",
                    f"review the change, then {reprotect} (restores the generated body)",
                )
            )
        elif actual != f.body_hash:
            out.append(
                Drift(
                    "function_mismatch",
                    obj,
                    f"{obj} was generated from another spec or template than the registry records",
                    reprotect,
                )
            )
    return out


def _column_drift(conn: Conn, oid: int, spec: FenceSpec) -> list[Drift]:
    row = conn.execute(
        "SELECT atttypid::pg_catalog.regtype::text FROM pg_catalog.pg_attribute "
        "WHERE attrelid = %s AND attname = %s AND attnum > 0 AND NOT attisdropped",
        (oid, spec.column),
    ).fetchone()
    obj = f"{spec.table.dotted}.{spec.column}"
    if row is None:
        return [
            Drift(
                "fence_column_missing",
                obj,
                f"fence column {spec.column} of {spec.table} was dropped: the row triggers fail "
                "or the row fences are lost",
                f"fencekit unprotect {spec.table} --dsn DSN, then protect again (fences restart)",
            )
        ]
    if row[0] != "bigint":
        return [
            Drift(
                "fence_column_altered",
                obj,
                f"fence column {spec.column} of {spec.table} is {row[0]}, not bigint",
                f"ALTER TABLE {spec.table} ALTER COLUMN {quote_ident(spec.column)} TYPE bigint",
            )
        ]
    return []


def _partition_drift(
    conn: Conn, oid: int, triggers: tuple[sqlgen.Trigger, ...], reprotect: str
) -> list[Drift]:
    wanted = {tr.name for tr in triggers if tr.on_partitions}
    out: list[Drift] = []
    parts = conn.execute(
        "SELECT relid::pg_catalog.oid, relid::pg_catalog.text "
        "FROM pg_catalog.pg_partition_tree(%s) WHERE relid <> %s::oid ORDER BY 2",
        (oid, oid),
    ).fetchall()
    for part_oid, part_sql in parts:
        drift = _trigger_drift(conn, part_oid, part_sql, part_sql, triggers, reprotect, wanted)
        missing = [d for d in drift if d.kind == "trigger_missing"]
        if missing:
            out.append(
                Drift(
                    "partition_triggers_missing",
                    f"partition {part_sql}",
                    f"partition {part_sql} has no fencekit statement triggers (attached after "
                    "protect?): statements that name the partition skip the statement checks",
                    reprotect,
                )
            )
        out += [d for d in drift if d.kind != "trigger_missing"]
    return out


def _cli_spec(spec: FenceSpec) -> str:
    """The command-line arguments that reproduce ``spec`` (shell-quoted)."""
    args = [str(spec.table)]
    if spec.scope is Scope.TABLE:
        args += ["--scope", "table"]
    for k in spec.key:
        args += ["--key", k]
    if spec.resource is not None:
        args += ["--resource", spec.resource]
    if spec.on_missing != "reject":
        args += ["--on-missing", spec.on_missing]
    if spec.on_equal != "accept":
        args += ["--on-equal", spec.on_equal]
    if spec.scope is Scope.ROW and spec.column != DEFAULT_COLUMN:
        args += ["--column", spec.column]
    if spec.issuer is not None:
        args += ["--issuer", spec.issuer]
    return " ".join(shlex.quote(a) for a in args)


# ------------------------------------------------------------------------------- rejections


def _add_rejections(conn: Conn, tables: list[ProtectedTable]) -> None:
    by_name = {(pt.spec.table.schema, pt.spec.table.name): pt for pt in tables}
    rows = conn.execute(
        "SELECT schema_name, table_name, reason, count, last_rejected_at, max_token_gap "
        "FROM fencekit.rejections ORDER BY schema_name, table_name, reason"
    ).fetchall()
    for schema, name, reason, count, last_at, gap in rows:
        pt = by_name.get((schema, name))
        if pt is None:
            continue
        pt.rejections[reason] = int(count or 0)
        pt.last_rejected_at = last_at
        pt.max_token_gap = int(gap) if gap is not None else None
