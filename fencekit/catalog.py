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
from collections.abc import Collection
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
    "Repairs",
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
    #: Every object concerned, when one drift groups several (ownership: one line per owner).
    objects: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "object": self.object,
            "message": self.message,
            "fix": self.fix,
            "objects": list(self.objects),
        }


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
    #: Worst lateness of a rejected token, seconds (key and table fences; fencekit.lateness).
    max_lateness_seconds: float | None = None

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
            "max_lateness_seconds": self.max_lateness_seconds,
        }


@dataclass(frozen=True)
class Repairs:
    """Fence repairs recorded in fencekit.repairs (``fencekit fence set``)."""

    count: int
    lowered: int
    last_at: datetime | None = None
    #: The last repair in one line; None when this role may not read the audit rows.
    last: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "lowered": self.lowered,
            "last_at": _iso(self.last_at),
            "last": self.last,
        }


@dataclass
class Status:
    core_version: int | None
    tables: list[ProtectedTable]
    # Database-wide: core missing or outdated, fencekit's objects owned by the wrong role.
    drift: list[Drift] = field(default_factory=list)
    # Server settings that weaken the lease tokens' guarantee; warnings, not drift.
    warnings: list[str] = field(default_factory=list)
    repairs: Repairs | None = None

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
            "repairs": self.repairs.to_dict() if self.repairs is not None else None,
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


def existing_table(conn: Conn, text: str) -> TableName:
    """``text`` resolved as SQL would, or a CatalogError naming the search_path."""
    found = resolve_table(conn, text)
    if found is None:
        raise CatalogError(f"table {text} does not exist (search_path: {search_path(conn)})")
    return found[0]


def protected_table(conn: Conn, text: str, hint: str) -> ProtectedTable:
    """The registry entry of the table ``text`` names, or a CatalogError ending in ``hint``."""
    table = existing_table(conn, text)
    pt = registered(conn, table)
    if pt is None:
        raise CatalogError(f"{table} is not protected: {hint}")
    return pt


def search_path(conn: Conn) -> str:
    row = conn.execute("SELECT pg_catalog.current_setting('search_path')").fetchone()
    return str(row[0]) if row else ""


def check_spec(conn: Conn, spec: FenceSpec, *, moving: bool = False) -> list[str]:
    """Validate ``spec`` against the live catalog; return notes for the user.

    A table protected with another structure is refused unless ``moving`` (``fencekit move``).

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
    if current is not None and not moving and sqlgen.is_move(current.spec, spec):
        # Policies change in place (protect re-runs keep the fences); another scope, key,
        # resource or fence column is a move, which carries the fences in one transaction.
        raise CatalogError(
            f"{t} is protected with another scope, key, resource or fence column "
            f"({describe(current.spec)}): move it in one transaction, its fences carried, "
            f"with `fencekit move {_cli_spec(spec)}` (review the script first: "
            f"`fencekit sql move {_cli_spec(spec)} --dsn DSN`)"
        )
    if current is not None and current.spec != spec:
        notes.append(
            f"{t} was protected with {describe(current.spec)}: its policies change in place, "
            "its fences are kept"
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


def status(conn: Conn, allow_triggers: Collection[str] = ()) -> Status:
    """Everything ``fencekit status`` shows (``core_missing`` drift without the core).

    ``allow_triggers``: names of foreign triggers a DBA has reviewed; they are not reported.
    """
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
    core_drift += ownership_drift(conn)
    core_drift += orphaned_fences(conn)
    tables = protected_tables(conn)
    for pt in tables:
        pt.drift = table_drift(conn, pt, allow_triggers)
    _add_rejections(conn, tables)
    _add_lateness(conn, tables)
    return Status(
        version, tables, core_drift, durability_warnings(conn), repairs=recent_repairs(conn)
    )


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
            f"{async_standbys} asynchronous standby(s): a failover to one of them loses the "
            "lease grants and fenced writes it had not received (tokens never repeat: the epoch "
            "rises; zombies are refused by lease-bound fences or a claim at grant); list them "
            "in synchronous_standby_names to lose nothing acknowledged (see docs/ha.md)"
        )
    if sync_commit in ("off", "local") and async_standbys:
        out.append(
            f"synchronous_commit = {sync_commit}: commits do not wait for standbys; fencekit's "
            "lease functions raise it for their own transactions, other writes are not covered"
        )
    return out


def table_drift(
    conn: Conn, pt: ProtectedTable, allow_triggers: Collection[str] = ()
) -> list[Drift]:
    """How ``pt``'s objects in the database differ from what its spec and template generate,
    what its descendants lack, and which foreign triggers can get around its checks."""
    t = pt.spec.table
    reprotect = f"fencekit protect {_cli_spec(pt.spec)} --dsn DSN (re-creates what is missing)"
    if pt.template_version < sqlgen.TEMPLATE_VERSION:
        # Generated by an older fencekit: this one renders only its own template, so the old
        # objects cannot be compared; re-protect replaces them (`fencekit install` does it).
        return [
            Drift(
                "template_outdated",
                t.dotted,
                f"objects generated by template {pt.template_version}; this fencekit generates "
                f"template {sqlgen.TEMPLATE_VERSION} and replaces them when protect runs again",
                reprotect,
            )
        ]
    if pt.template_version > sqlgen.TEMPLATE_VERSION:
        return [
            Drift(
                "template_unknown",
                t.dotted,
                f"objects generated by template {pt.template_version}, newer than this "
                f"fencekit's {sqlgen.TEMPLATE_VERSION}",
                "upgrade fencekit",
            )
        ]
    objs = sqlgen.table_objects(pt.spec)
    out: list[Drift] = []
    row = conn.execute(
        "SELECT c.oid, c.relkind::text FROM pg_catalog.pg_class c "
        "WHERE c.oid = pg_catalog.to_regclass(%s)",
        (t.sql,),
    ).fetchone()
    if row is None:
        renamed = renamed_to(conn, pt)
        if renamed is not None:
            return [
                Drift(
                    "table_renamed",
                    t.dotted,
                    f"table {t} was renamed to {renamed}: its triggers still check writes, but "
                    "the registry, the objects' names and a default resource's name are the "
                    "old ones",
                    f"fencekit rename {shlex.quote(str(t))} {shlex.quote(str(renamed))} --dsn DSN "
                    "(moves the protection to the new name in one transaction)",
                )
            ]
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
    oid = row[0]
    # The root guard exists only where PostgreSQL allows it (sqlgen.protect.root_guard).
    guarded = conn.execute(
        "SELECT c.relkind = 'r' AND NOT c.relispartition AND NOT EXISTS "
        "(SELECT FROM pg_catalog.pg_inherits i WHERE i.inhrelid = c.oid) "
        "FROM pg_catalog.pg_class c WHERE c.oid = %s",
        (oid,),
    ).fetchone()
    root_triggers = tuple(
        tr for tr in objs.triggers if not tr.root_only or (guarded is not None and guarded[0])
    )
    out += _trigger_drift(conn, oid, t.sql, t.dotted, root_triggers, reprotect)
    out += _function_drift(conn, objs.functions, reprotect)
    if pt.spec.scope is Scope.ROW:
        out += _column_drift(conn, oid, pt.spec)
    if pt.spec.scope is Scope.KEY:
        out += _key_type_drift(conn, oid, pt.spec)
    allow = frozenset(allow_triggers)
    out += _foreign_trigger_drift(conn, oid, t.sql, pt.spec, objs, allow)
    for desc in _descendants(conn, oid):
        out += _descendant_drift(conn, desc, objs, reprotect)
        out += _foreign_trigger_drift(conn, desc.oid, desc.sql, pt.spec, objs, allow, clones=False)
    return out


def renamed_to(conn: Conn, pt: ProtectedTable) -> TableName | None:
    """The table now carrying the TRUNCATE trigger of ``pt`` (every scope has one; registered
    under a name that no longer exists): ``pt``'s table, renamed. The trigger's name comes
    from the registry's tag, so a table protected by any template is found."""
    row = conn.execute(
        "SELECT n.nspname, c.relname FROM pg_catalog.pg_trigger g "
        "JOIN pg_catalog.pg_class c ON c.oid = g.tgrelid "
        "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "WHERE g.tgname = %s AND NOT c.relispartition AND NOT EXISTS "
        "(SELECT FROM pg_catalog.pg_inherits i WHERE i.inhrelid = c.oid) LIMIT 1",
        (f"fencekit_{pt.tag}_trunc",),
    ).fetchone()
    return TableName(row[0], row[1]) if row is not None else None


def orphaned_fences(conn: Conn) -> list[Drift]:
    """Key and table fences whose resource no protected table uses (an unprotect script that
    did not remove them, a dropped table, a restore): they come back into force if a table is
    protected with that resource again."""
    rows = conn.execute(
        "SELECT f.resource, pg_catalog.count(*), pg_catalog.max(f.fence) FROM fencekit.fences f "
        "WHERE NOT EXISTS (SELECT FROM fencekit.protected p WHERE p.resource = f.resource) "
        "GROUP BY f.resource ORDER BY f.resource"
    ).fetchall()
    return [
        Drift(
            "orphaned_fences",
            str(resource),
            f"{count} fence(s) of resource {resource!r} (highest {high}) belong to no protected "
            "table; protecting a table with that resource would bring them back into force",
            "as a member of fencekit_admin: DELETE FROM fencekit.fences WHERE resource = "
            f"{quote_literal(str(resource))}",
        )
        for resource, count, high in rows
    ]


def _key_type_drift(conn: Conn, oid: int, spec: FenceSpec) -> list[Drift]:
    """A key column whose type changed since protect names its keys differently: the old
    fences no longer guard the rows (1 becomes 1.00 when an integer key turns numeric(10,2))."""
    import psycopg

    obj = f"{spec.table.dotted} key ({', '.join(spec.key)})"
    fix = (
        "restore the column types; or move the fences to the new key text (UPDATE "
        "fencekit.fences as a member of fencekit_admin); or unprotect and protect again "
        "(the fences restart)"
    )
    try:
        with conn.transaction():
            row = conn.execute(
                "SELECT p.key_families, fencekit.key_families(%s::pg_catalog.oid::pg_catalog."
                "regclass, %s) FROM fencekit.protected p "
                "WHERE p.schema_name = %s AND p.table_name = %s",
                (oid, list(spec.key), spec.table.schema, spec.table.name),
            ).fetchone()
    except psycopg.Error as exc:
        detail = exc.diag.message_primary or str(exc)
        return [
            Drift("key_type_changed", obj, f"a key column can no longer be a key: {detail}", fix)
        ]
    if row is None or row[0] is None or list(row[0]) == list(row[1]):
        return []
    return [
        Drift(
            "key_type_changed",
            obj,
            f"the key columns changed type since protect ({', '.join(row[0])} -> "
            f"{', '.join(row[1])}): the fences are named by the old text of each key, so "
            "stale writes to the new keys pass",
            fix,
        )
    ]


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


# ------------------------------------------------------------------------------- descendants


@dataclass(frozen=True)
class _Descendant:
    oid: int
    sql: str  # as regclass prints it
    is_partition: bool
    relkind: str


def _descendants(conn: Conn, oid: int) -> list[_Descendant]:
    """Every partition and inheritance child of a table, at any depth (pg_inherits)."""
    rows = conn.execute(
        """WITH RECURSIVE d(relid) AS (
             SELECT inhrelid FROM pg_catalog.pg_inherits WHERE inhparent = %s
             UNION
             SELECT i.inhrelid FROM pg_catalog.pg_inherits i JOIN d ON i.inhparent = d.relid)
           SELECT c.oid, c.oid::pg_catalog.regclass::pg_catalog.text, c.relispartition,
                  c.relkind::pg_catalog.text
             FROM d JOIN pg_catalog.pg_class c ON c.oid = d.relid
            ORDER BY 2""",
        (oid,),
    ).fetchall()
    return [_Descendant(int(o), str(sql), bool(part), str(kind)) for o, sql, part, kind in rows]


def _descendant_drift(
    conn: Conn, desc: _Descendant, objs: sqlgen.TableObjects, reprotect: str
) -> list[Drift]:
    """fencekit triggers a descendant lacks, has disabled or has rewired.

    PostgreSQL fires a table's statement triggers only for statements that name it, so every
    descendant needs its own; row triggers reach a partition as clones PostgreSQL makes itself,
    but an inheritance child gets none unless protect put them there.
    """
    # Foreign tables cannot have TRUNCATE triggers.
    usable = [
        tr
        for tr in objs.triggers
        if not tr.root_only and not (desc.relkind == "f" and "TRUNCATE" in tr.timing)
    ]
    wanted = {tr.name for tr in usable if tr.level == "STATEMENT" or not desc.is_partition}
    present = _triggers_of(conn, desc.oid)
    label = f"partition {desc.sql}" if desc.is_partition else f"child table {desc.sql}"
    out: list[Drift] = []
    missing = [tr.name for tr in usable if tr.name in wanted and tr.name not in present]
    if missing:
        if desc.is_partition:
            what = (
                f"partition {desc.sql} lacks fencekit's statement trigger(s) "
                f"{', '.join(missing)} (attached or created after protect?): statements that "
                "name the partition skip the statement checks"
            )
        else:
            row_missing = any(tr.level == "ROW" for tr in usable if tr.name in missing)
            what = (
                f"inheritance child {desc.sql} lacks fencekit's trigger(s) "
                f"{', '.join(missing)} (created after protect?): "
                + (
                    "rows written in it, also through the parent, are not checked"
                    if row_missing
                    else "statements that name the child skip the statement checks"
                )
            )
        kind = "partition_triggers_missing" if desc.is_partition else "child_triggers_missing"
        out.append(Drift(kind, label, what, reprotect))
    # Disabled, replica-only or rewired fencekit triggers, cloned row triggers included.
    there = {tr.name for tr in usable if tr.name in present}
    for d in _trigger_drift(conn, desc.oid, desc.sql, label, tuple(usable), reprotect, there):
        out.append(Drift(d.kind, d.object, f"on {label}: {d.message}", d.fix))
    return out


# ------------------------------------------------------------------------------- foreign triggers

# pg_trigger.tgtype bits (PostgreSQL's TRIGGER_TYPE_*).
_TG_ROW = 1
_TG_BEFORE = 2
_TG_EVENTS = ((4, "INSERT"), (16, "UPDATE"), (8, "DELETE"), (32, "TRUNCATE"))


@dataclass(frozen=True)
class _Trig:
    name: str
    tgtype: int
    enabled: str
    function: str  # schema.name
    cloned: bool  # a partition's clone of its parent's trigger

    @property
    def row(self) -> bool:
        return bool(self.tgtype & _TG_ROW)

    @property
    def before(self) -> bool:
        return bool(self.tgtype & _TG_BEFORE)

    def events(self) -> list[str]:
        return [name for bit, name in _TG_EVENTS if self.tgtype & bit]

    def order(self) -> tuple[int, bytes]:
        """Firing order among the triggers of one event: BEFORE statement, BEFORE row, AFTER
        row, AFTER statement, and within each by name in byte order (as PostgreSQL sorts
        them)."""
        phase = (1 if self.row else 0) if self.before else (2 if self.row else 3)
        return (phase, self.name.encode())


def _relation_triggers(conn: Conn, oid: int) -> list[_Trig]:
    return [
        _Trig(name, int(tgtype), enabled, func, bool(cloned))
        for name, tgtype, enabled, func, cloned in conn.execute(
            "SELECT t.tgname, t.tgtype::pg_catalog.int4, t.tgenabled::pg_catalog.text, "
            "n.nspname || '.' || p.proname, t.tgparentid <> 0 "
            "FROM pg_catalog.pg_trigger t "
            "JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid "
            "JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace "
            "WHERE t.tgrelid = %s AND NOT t.tgisinternal ORDER BY t.tgname",
            (oid,),
        ).fetchall()
    ]


def _foreign_trigger_drift(
    conn: Conn,
    oid: int,
    rel_sql: str,
    spec: FenceSpec,
    objs: sqlgen.TableObjects,
    allow: frozenset[str],
    clones: bool = True,
) -> list[Drift]:
    """Triggers that are not fencekit's and can get around its checks on one relation.

    fencekit's first check of a statement reads the token once; a trigger that fires ahead of
    it can set fencekit.token (set_config) or, at row level, change the row first. That first
    check is the statement check, except on key-fenced tables, whose INSERT, UPDATE and DELETE
    are judged by AFTER STATEMENT triggers: every BEFORE trigger and AFTER ROW trigger fires
    ahead of them. On a row-fenced table any BEFORE ROW INSERT/UPDATE trigger can also
    overwrite the fence column after fencekit's trigger set it. ``clones=False`` skips a
    partition's clones of its parent's triggers (reported on the parent).
    """
    ours = {tr.name for tr in objs.triggers}
    trigs = _relation_triggers(conn, oid)

    def is_fencekit(t: _Trig) -> bool:
        return t.name in ours or (
            t.name.startswith("fencekit_") and t.function.startswith("fencekit.")
        )

    # Disabled triggers never fire; ENABLE REPLICA ones only where fencekit's do not.
    firing = [t for t in trigs if t.enabled not in ("D", "R")]
    first: dict[str, _Trig] = {}
    for event in ("INSERT", "UPDATE", "DELETE", "TRUNCATE"):
        checks = [t for t in firing if is_fencekit(t) and event in t.events()]
        if checks:
            first[event] = min(checks, key=_Trig.order)
    column = quote_ident(spec.column)
    out: list[Drift] = []
    for t in firing:
        if is_fencekit(t) or t.name in allow or (t.cloned and not clones):
            continue
        ahead = [e for e in t.events() if e in first and t.order() < first[e].order()]
        rewrites = (
            spec.scope is Scope.ROW
            and t.row
            and t.before
            and bool({"INSERT", "UPDATE"} & set(t.events()))
        )
        if not ahead and not rewrites:
            continue
        level = "row" if t.row else "statement"
        obj = f"{rel_sql}: trigger {t.name}"
        silence = f"fencekit status --allow-trigger {shlex.quote(t.name)}"
        if ahead:
            passed = sorted({first[e].name for e in ahead})
            can = "set fencekit.token (set_config), so the statement is judged by a token its "
            can += "writer never presented"
            if t.row and spec.scope is not Scope.KEY:
                can += ", or change the row before fencekit checks it"
            if rewrites:
                can += f", and overwrite NEW.{column}, the row's fence"
            # PostgreSQL truncates names to 63 bytes.
            renamed = quote_ident(("zz_" + t.name).encode()[:63].decode(errors="ignore"))
            # A new name helps only a trigger that fires in the same phase as fencekit's check.
            movable = all(t.order()[0] == first[e].order()[0] for e in ahead)
            move = (
                ", let it fire after fencekit's checks: ALTER TRIGGER "
                f"{quote_ident(t.name)} ON {rel_sql} RENAME TO {renamed}; once reviewed, "
                if movable
                else " (it fires ahead of fencekit's check whatever its name); once reviewed, "
            )
            out.append(
                Drift(
                    "foreign_trigger_first",
                    obj,
                    f"{'BEFORE' if t.before else 'AFTER'} {level} trigger {t.name} "
                    f"(function {t.function}) fires on "
                    f"{' '.join(ahead)} ahead of fencekit's {', '.join(passed)}: it can {can}",
                    f"review {t.function}; if it has no business with fencekit.token"
                    + (f" or NEW.{column}" if rewrites else "")
                    + move
                    + f"silence it: {silence}",
                )
            )
        else:
            out.append(
                Drift(
                    "foreign_trigger_fence_column",
                    obj,
                    f"BEFORE row trigger {t.name} (function {t.function}) fires on "
                    f"{' '.join(e for e in t.events() if e in ('INSERT', 'UPDATE'))} after "
                    f"fencekit's row trigger set the fence: it can overwrite NEW.{column}, the "
                    "row's fence, and let a later stale write in",
                    f"review {t.function}: it must never assign NEW.{column} (or drop the "
                    f"trigger); once reviewed, silence it: {silence}",
                )
            )
    return out


# ------------------------------------------------------------------------------- ownership

# Every object in schema fencekit with its owner and the ALTER that changes it (without OWNER
# TO). Indexes and a table's own sequences follow their table; array types follow their element.
_OWNED_SQL = """
SELECT 'schema' AS kind, 'fencekit' AS name, n.nspowner AS owner,
       'ALTER SCHEMA fencekit' AS alter_sql, n.nspname AS ident
  FROM pg_catalog.pg_namespace n WHERE n.nspname = 'fencekit'
UNION ALL
SELECT CASE c.relkind WHEN 'S' THEN 'sequence' WHEN 'v' THEN 'view'
                      WHEN 'm' THEN 'materialized view' WHEN 'f' THEN 'foreign table'
                      WHEN 'c' THEN 'type' ELSE 'table' END,
       'fencekit.' || pg_catalog.quote_ident(c.relname), c.relowner,
       'ALTER ' || CASE c.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW'
                                  WHEN 'm' THEN 'MATERIALIZED VIEW' WHEN 'f' THEN 'FOREIGN TABLE'
                                  WHEN 'c' THEN 'TYPE' ELSE 'TABLE' END
         || ' fencekit.' || pg_catalog.quote_ident(c.relname), c.relname
  FROM pg_catalog.pg_class c
 WHERE c.relnamespace = 'fencekit'::pg_catalog.regnamespace
   AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f', 'c')
   AND NOT EXISTS (SELECT FROM pg_catalog.pg_depend d
                    WHERE c.relkind = 'S' AND d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass
                      AND d.objid = c.oid AND d.deptype IN ('a', 'i')
                      AND d.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass)
UNION ALL
SELECT CASE p.prokind WHEN 'p' THEN 'procedure' WHEN 'a' THEN 'aggregate' ELSE 'function' END,
       'fencekit.' || pg_catalog.quote_ident(p.proname) || s.args, p.proowner,
       'ALTER ' || CASE p.prokind WHEN 'p' THEN 'PROCEDURE' WHEN 'a' THEN 'AGGREGATE'
                                  ELSE 'FUNCTION' END
         || ' fencekit.' || pg_catalog.quote_ident(p.proname) || s.args, p.proname
  FROM pg_catalog.pg_proc p,
       LATERAL (SELECT CASE p.prokind
                  WHEN 'a' THEN '(' || pg_catalog.pg_get_function_identity_arguments(p.oid) || ')'
                  ELSE '(' || COALESCE((SELECT pg_catalog.string_agg(
                                               pg_catalog.format_type(a.t, NULL), ', '
                                               ORDER BY a.n)
                                          FROM pg_catalog.unnest(p.proargtypes::pg_catalog.oid[])
                                               WITH ORDINALITY AS a(t, n)), '') || ')'
                  END) AS s(args)
 WHERE p.pronamespace = 'fencekit'::pg_catalog.regnamespace
UNION ALL
SELECT 'type', 'fencekit.' || pg_catalog.quote_ident(t.typname), t.typowner,
       'ALTER TYPE fencekit.' || pg_catalog.quote_ident(t.typname), t.typname
  FROM pg_catalog.pg_type t
 WHERE t.typnamespace = 'fencekit'::pg_catalog.regnamespace AND t.typtype IN ('e', 'd', 'r')
"""

_SHOWN = 3  # object names a grouped ownership line shows before "and N more"
_LISTED = 5  # up to this many objects the fix lists ALTER statements; beyond, a DO block


def ownership_drift(conn: Conn) -> list[Drift]:
    """fencekit's objects owned by another role than the one that installed it, or by a role
    that is neither a superuser nor a member of fencekit_admin. A protected table's generated
    functions and counters may also belong to any superuser or member of fencekit_admin (the
    role that ran protect).

    Whoever owns fencekit's tables and functions can lower fences, edit the registry and
    replace the checks; a ``pg_restore`` run by an application role leaves them all owned by
    it. The installing role is ``fencekit.meta``'s ``owner`` row; cores installed before it
    existed fall back to the owner of schema fencekit.
    """
    schema = conn.execute(
        "SELECT n.nspowner::pg_catalog.regrole::pg_catalog.text FROM pg_catalog.pg_namespace n "
        "WHERE n.nspname = 'fencekit'"
    ).fetchone()
    if schema is None:
        return []
    out: list[Drift] = []
    recorded = conn.execute("SELECT value FROM fencekit.meta WHERE key = 'owner'").fetchone()
    expected, source = str(schema[0]), "the owner of schema fencekit"
    if recorded is not None:
        exists = conn.execute(
            "SELECT pg_catalog.quote_ident(rolname) FROM pg_catalog.pg_roles WHERE rolname = %s",
            (recorded[0],),
        ).fetchone()
        if exists is not None:
            expected, source = str(exists[0]), "the role that installed fencekit"
        else:
            out.append(
                Drift(
                    "owner_role_missing",
                    "fencekit",
                    f"role {recorded[0]!r}, recorded in fencekit.meta as the role that "
                    f"installed fencekit, does not exist (renamed or dropped?); comparing "
                    f"owners with {expected}, the owner of schema fencekit",
                    "record the role that administers fencekit (as a member of fencekit_admin): "
                    "UPDATE fencekit.meta SET value = '<admin_role>' WHERE key = 'owner'",
                )
            )
    # A protected table's own functions and counters belong to whoever ran protect: the
    # installing role, or a member of fencekit_admin such as the migration role.
    rows = conn.execute(
        "SELECT o.kind, o.name, o.alter_sql, r.rolname, r.rolsuper, "
        "       pg_catalog.pg_has_role(r.oid, a.oid, 'MEMBER'), "
        "       o.kind IN ('function', 'sequence') AND EXISTS ("
        "         SELECT FROM fencekit.protected t WHERE pg_catalog.left(o.ident, "
        "           pg_catalog.length(t.tag) + 1) IN (t.tag || '_', t.tag || ':')) "
        f"FROM ({_OWNED_SQL}) o "
        "JOIN pg_catalog.pg_roles r ON r.oid = o.owner "
        "LEFT JOIN pg_catalog.pg_roles a ON a.rolname = 'fencekit_admin' "
        "ORDER BY r.rolname, o.kind <> 'schema', o.kind, o.name"
    ).fetchall()
    by_owner: dict[str, list[tuple[str, str, str]]] = {}
    privileged: dict[str, bool] = {}
    for kind, name, alter_sql, owner, is_super, is_admin, per_table in rows:
        role = quote_ident(owner)
        privileged[role] = bool(is_super) or bool(is_admin)
        if per_table and privileged[role] and role != expected:
            continue
        by_owner.setdefault(role, []).append((kind, name, alter_sql))
    record = (
        "UPDATE fencekit.meta SET value = {new} WHERE key = 'owner'" if recorded is not None else ""
    )
    for role, objects in by_owner.items():
        names = tuple(f"{kind} {name}" for kind, name, _ in objects)
        shown = ", ".join(names[:_SHOWN]) + (
            f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
        )
        unprivileged = (
            f"{role} is neither a superuser nor a member of fencekit_admin"
            if not privileged[role]
            else ""
        )
        if role != expected:
            # One line per owner: an unprivileged owner is said here, not on a line of its own.
            out.append(
                Drift(
                    "owner_changed",
                    f"owner {role}",
                    f"{len(objects)} object(s) in schema fencekit are owned by {role}, not "
                    f"{expected} ({source}): {shown}. Their owner can lower fences, edit the "
                    "registry and replace the checks (a pg_restore run by an application role "
                    "leaves them so)" + (f"; {unprivileged}" if unprivileged else ""),
                    _owner_fix(role, expected, objects),
                    names,
                )
            )
        elif unprivileged:
            admin = "<admin_role>"
            give = _owner_fix(role, admin, objects)
            if record:
                give += "; " + record.format(new=quote_literal(admin))
            out.append(
                Drift(
                    "owner_unprivileged",
                    f"owner {role}",
                    f"{role} owns {len(objects)} object(s) in schema fencekit ({shown}) but "
                    "is neither a superuser nor a member of fencekit_admin: if applications "
                    "log in as it (or as a member of it), they can lower fences, edit the "
                    "registry and replace the checks",
                    f"if {role} is an application role, give fencekit's objects to a role "
                    "that administers fencekit (a superuser or a member of fencekit_admin that "
                    f"applications never log in as): {give}\n"
                    f"if {role} is that role already: GRANT fencekit_admin TO {role}",
                    names,
                )
            )
    return out


def _owner_fix(old: str, new: str, objects: list[tuple[str, str, str]]) -> str:
    """SQL a DBA runs (superuser, or member of both roles) to give ``old``'s objects to ``new``.

    A few objects: their ALTER statements. More: a DO block over the catalog (REASSIGN OWNED
    would also take the application's own tables, and its database, from ``old``).
    """
    if len(objects) <= _LISTED:
        return "; ".join(f"{alter_sql} OWNER TO {new}" for _, _, alter_sql in objects)
    by = f"{quote_literal(old)}::pg_catalog.regrole"
    ns = "'fencekit'::pg_catalog.regnamespace"
    return "\n".join(
        [
            "DO $fix$",
            "DECLARE o text;",
            "BEGIN",
            f"  IF (SELECT nspowner FROM pg_catalog.pg_namespace WHERE nspname = 'fencekit') = {by}"
            f" THEN ALTER SCHEMA fencekit OWNER TO {new}; END IF;",
            "  FOR o IN SELECT c.oid::pg_catalog.regclass FROM pg_catalog.pg_class c",
            f"    WHERE c.relnamespace = {ns} AND c.relowner = {by}",
            "      AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S') AND NOT EXISTS (SELECT FROM",
            "      pg_catalog.pg_depend d WHERE c.relkind = 'S' AND d.objid = c.oid",
            "      AND d.deptype IN ('a', 'i')",
            "      AND d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass",
            "      AND d.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass)",
            f"  LOOP EXECUTE 'ALTER TABLE ' || o || ' OWNER TO {new}'; END LOOP;",
            "  FOR o IN SELECT p.oid::pg_catalog.regprocedure FROM pg_catalog.pg_proc p",
            f"    WHERE p.pronamespace = {ns} AND p.proowner = {by}",
            f"  LOOP EXECUTE 'ALTER ROUTINE ' || o || ' OWNER TO {new}'; END LOOP;",
            "  FOR o IN SELECT t.oid::pg_catalog.regtype FROM pg_catalog.pg_type t",
            f"    WHERE t.typnamespace = {ns} AND t.typowner = {by}",
            "      AND t.typtype IN ('e', 'd', 'r')",
            f"  LOOP EXECUTE 'ALTER TYPE ' || o || ' OWNER TO {new}'; END LOOP;",
            "END",
            "$fix$;",
        ]
    )


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


def _add_lateness(conn: Conn, tables: list[ProtectedTable]) -> None:
    if conn.execute("SELECT pg_catalog.to_regclass('fencekit.lateness')").fetchone() == (None,):
        return  # core older than the lateness gauge; status reports core_outdated
    by_name = {(pt.spec.table.schema, pt.spec.table.name): pt for pt in tables}
    for schema, name, late in conn.execute(
        "SELECT schema_name, table_name, max_lateness_seconds FROM fencekit.lateness"
    ).fetchall():
        pt = by_name.get((schema, name))
        if pt is not None and late is not None:
            pt.max_lateness_seconds = float(late)


def recent_repairs(conn: Conn) -> Repairs | None:
    """How many fence repairs fencekit.repairs holds, and the last one (its audit row is
    readable by fencekit_admin only: others get the counts)."""
    if conn.execute("SELECT pg_catalog.to_regclass('fencekit.repairs')").fetchone() == (None,):
        return None
    count, lowered, last_at = conn.execute(
        "SELECT COALESCE(pg_catalog.sum(repairs), 0), COALESCE(pg_catalog.sum(lowered), 0), "
        "pg_catalog.max(last_repaired_at) FROM fencekit.repair_counts"
    ).fetchone() or (0, 0, None)
    last = None
    readable = conn.execute(
        "SELECT pg_catalog.has_table_privilege('fencekit.repairs', 'SELECT')"
    ).fetchone()
    if count and readable and readable[0]:
        row = conn.execute(
            "SELECT repaired_at, repaired_by, schema_name, table_name, scope, resource, key, "
            "old_fence, new_fence, reason FROM fencekit.repairs ORDER BY id DESC LIMIT 1"
        ).fetchone()
        if row is not None:
            at, who, schema, name, scope, resource, key, old, new, reason = row
            where = f"{schema}.{name}" if name is not None else f"resource {resource}"
            what = "" if scope == "table" else f" key {key}"
            last = (
                f"{_iso(at)} by {who}: {where}{what} fence {old if old is not None else 'none'}"
                f" -> {new}" + (f" ({reason})" if reason else "")
            )
    return Repairs(int(count), int(lowered), last_at, last)
