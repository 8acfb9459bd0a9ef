"""The registry and the tables it names: is the core installed, which tables are protected
and with what spec, and does a spec fit the live table (``check_spec``). Reads only."""

from __future__ import annotations

from typing import Any

from fencekit import sqlgen
from fencekit.catalog.model import Action, Command, Conn, ProtectedTable
from fencekit.catalog.session import caller_search_path, regclass_oid
from fencekit.errors import CatalogError, SpecError
from fencekit.ident import quote_ident
from fencekit.spec import FenceSpec, Scope, TableName

__all__ = [
    "check_spec",
    "core_version",
    "existing_table",
    "protected_table",
    "protected_tables",
    "registered",
    "require_core",
    "resolve_table",
    "search_path",
]


def core_version(conn: Conn) -> int | None:
    """The installed core version, or None when fencekit's core is not installed.

    Before it reads anything in schema fencekit, the install's own guard (catalogs only)
    refuses (YF000) a schema with another role's code attached to its tables, views and types:
    a table owner with CREATE on the database can leave one before the first install or after
    an uninstall, and reading its fencekit.meta would run that code with this session's
    rights. What another role merely owns there, status reports (owner_changed).
    """
    row = conn.execute(
        "SELECT pg_catalog.to_regnamespace('fencekit') IS NOT NULL, "
        "pg_catalog.to_regclass('fencekit.meta') IS NOT NULL"
    ).fetchone()
    if not row or not row[0]:
        return None
    # Objects merely owned by another role are status's to report (owner_changed).
    conn.execute(
        (
            "SELECT pg_catalog.set_config('fencekit.guard_reading', 'on', true);\n"
            + sqlgen.core_guard()
            + "\nSELECT pg_catalog.set_config('fencekit.guard_reading', '', true);"
        ).encode()
    )
    if not row[1]:
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
            "fencekit's core is not installed in this database", Command(Action.INSTALL)
        )
    if version < sqlgen.CORE_VERSION:
        raise CatalogError(
            f"fencekit's core in this database is version {version}, older than this fencekit's "
            f"{sqlgen.CORE_VERSION}",
            Command(Action.INSTALL),
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
    oid = regclass_oid(conn, text)
    if oid is None:
        return None
    row = conn.execute(
        "SELECT n.nspname, c.relname, c.relkind::text FROM pg_catalog.pg_class c "
        "JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace "
        "WHERE c.oid OPERATOR(pg_catalog.=) %s::pg_catalog.oid",
        (oid,),
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
    """The search_path a user's table names resolve through (the CLI pins its own)."""
    return caller_search_path(conn)


def check_spec(conn: Conn, spec: FenceSpec, *, moving: bool = False) -> list[str]:
    """Validate ``spec`` against the live catalog; return notes for the user.

    A table protected with another structure is refused unless ``moving`` (``fencekit move``).

    Raises :class:`CatalogError`: the table does not exist or is not a table, is a partition,
    a key column is missing or nullable, or the fence column exists with another type.
    """
    t = spec.table
    row = conn.execute(
        "SELECT c.oid, c.relkind::text, c.relispartition FROM pg_catalog.pg_class c "
        "WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(%s)",
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
                "choose another fence column name"
            )
    if relkind == "p":
        parts = conn.execute(
            "SELECT count(*) FROM pg_catalog.pg_partition_tree(%s) WHERE relid <> %s::oid",
            (oid, oid),
        ).fetchone()
        notes.append(
            f"{t} is partitioned: its {parts[0] if parts else 0} existing partition(s) get "
            "fencekit's statement triggers too; re-run protect after attaching new partitions "
            "(status reports partitions without them)"
        )
    current = registered(conn, t)
    if current is not None and not moving and sqlgen.is_move(current.spec, spec):
        # Policies change in place (protect re-runs keep the fences); another scope, key,
        # resource or fence column is a move, which carries the fences in one transaction.
        raise CatalogError(
            f"{t} is protected with another {_changed(current.spec, spec, moves=True)} "
            f"({current.spec.describe()}): move it in one transaction, its fences carried",
            Command(Action.MOVE, spec),
        )
    if current is not None and current.spec != spec:
        notes.append(
            f"{t} was protected with {current.spec.describe()}: its policies change in place "
            f"({_changed(current.spec, spec, moves=False)}), its fences are kept"
        )
    return notes


# The spec fields whose change is a move (sqlgen.is_move); any other field changes in place.
_MOVE_FIELDS = ("scope", "key", "resource", "column")


def _changed(old: FenceSpec, new: FenceSpec, *, moves: bool) -> str:
    """The fields that differ between two specs of one table, named with both values."""
    import dataclasses

    names = [
        f.name
        for f in dataclasses.fields(old)
        if f.name != "table"
        and (f.name in _MOVE_FIELDS) == moves
        and getattr(old, f.name) != getattr(new, f.name)
    ]
    shown = ", ".join(
        f"{n} ({_shown(getattr(old, n))} -> {_shown(getattr(new, n))})" for n in names
    )
    return shown or ("fence column" if moves else "policies")


def _shown(value: object) -> str:
    if isinstance(value, tuple):
        return ", ".join(map(str, value)) or "none"
    return "none" if value is None else str(getattr(value, "value", value))
