"""Read table definitions from SQL files (pglast), and parse-check generated SQL.

``fencekit sql protect TABLE --from-ddl schema.sql`` validates a spec with no database: the
files are replayed in order (CREATE TABLE, CREATE TABLE ... PARTITION OF, ALTER TABLE ADD
COLUMN / ADD CONSTRAINT / SET NOT NULL / ATTACH PARTITION, renames and drops) into a small model
of the schema, and :func:`validate` checks the spec against it. Every error names the offending
object and the ``file:line`` that defined it (or the last file read, for a missing table).

Unqualified names resolve to the first schema of the last ``SET search_path`` seen (``public``
before any), which is what a psql run of the same files would do for a default search_path.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pglast
from pglast import ast
from pglast.enums import AlterTableType, ConstrType, ObjectType

from fencekit.errors import DdlError, SpecError
from fencekit.ident import quote_ident
from fencekit.spec import DEFAULT_SCHEMA, FenceSpec, Scope, TableName

__all__ = [
    "Column",
    "DdlError",
    "Schema",
    "Table",
    "parse_check",
    "read_ddl",
    "validate",
]

# Types PostgreSQL makes NOT NULL by themselves.
_IMPLICIT_NOT_NULL = {"serial", "serial4", "bigserial", "serial8", "smallserial", "serial2"}
_TYPE_ALIASES = {"bigint": "int8", "integer": "int4", "int": "int4", "smallint": "int2"}


@dataclass(frozen=True)
class Where:
    """A place in a schema file, for messages."""

    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass
class Column:
    name: str
    type_name: str  # last part of the type name, aliases folded: int8, text, ...
    not_null: bool
    where: Where


@dataclass
class Table:
    name: TableName
    where: Where
    columns: dict[str, Column] = field(default_factory=dict)
    primary_key: tuple[str, ...] = ()
    partitioned: bool = False
    partition_of: TableName | None = None
    partitions: list[TableName] = field(default_factory=list)


@dataclass
class Schema:
    """The tables the files define, in the state the last statement left them."""

    tables: dict[TableName, Table] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    search_path: str = DEFAULT_SCHEMA

    def get(self, name: TableName) -> Table | None:
        return self.tables.get(name)


# ------------------------------------------------------------------------------- reading


class _Reader:
    # pglast types every AST field as optional; statements are handled as Any and the fields
    # each statement kind always has are read directly.
    def __init__(self, schema: Schema, text: str, filename: str) -> None:
        self.schema = schema
        self.text = text
        self.filename = filename

    def where(self, offset: int | None) -> Where:
        return Where(self.filename, self.text.count("\n", 0, max(offset or 0, 0)) + 1)

    def table_name(self, rv: Any) -> TableName:
        return TableName(rv.schemaname or self.schema.search_path, rv.relname)

    def table(self, rv: Any, stmt_at: int, missing_ok: bool = False) -> Table | None:
        name = self.table_name(rv)
        found = self.schema.get(name)
        if found is None and not missing_ok:
            raise DdlError(
                f"{self.where(_loc(rv, stmt_at))}: table {name} is altered here but no earlier "
                "CREATE TABLE defines it (list the file that creates it first with --from-ddl)"
            )
        return found

    def read(self) -> None:
        try:
            stmts = pglast.parse_sql(self.text)
        except pglast.parser.ParseError as exc:
            at = exc.args[1] if len(exc.args) > 1 and isinstance(exc.args[1], int) else None
            where = self.where(at) if at is not None else self.filename
            raise DdlError(f"{where}: cannot parse SQL: {exc.args[0]}") from exc
        for raw in stmts:
            at = raw.stmt_location or 0
            stmt = raw.stmt
            if isinstance(stmt, ast.CreateStmt):
                self.create(stmt, at)
            elif isinstance(stmt, ast.AlterTableStmt):
                self.alter(stmt, at)
            elif isinstance(stmt, ast.RenameStmt):
                self.rename(stmt, at)
            elif isinstance(stmt, ast.DropStmt):
                self.drop(stmt)
            elif isinstance(stmt, ast.VariableSetStmt):
                self.set_var(stmt)
            elif isinstance(stmt, ast.SelectStmt):
                self.set_config(stmt)

    # -- statements

    def create(self, stmt: Any, at: int) -> None:
        name = self.table_name(stmt.relation)
        if name in self.schema.tables and stmt.if_not_exists:
            return
        table = Table(name, self.where(_loc(stmt.relation, at)))
        table.partitioned = stmt.partspec is not None
        if stmt.partbound is not None and stmt.inhRelations:
            parent = self.table(stmt.inhRelations[0], at)
            assert parent is not None
            table.partition_of = parent.name
            parent.partitions.append(name)
            for col in parent.columns.values():
                table.columns[col.name] = Column(col.name, col.type_name, col.not_null, col.where)
            table.primary_key = parent.primary_key
        for elt in stmt.tableElts or ():
            if isinstance(elt, ast.ColumnDef):
                self.add_column(table, elt, at)
            elif isinstance(elt, ast.Constraint):
                self.add_constraint(table, elt, at)
        self.schema.tables[name] = table

    def add_column(self, table: Table, col: Any, at: int) -> None:
        if col.colname in table.columns and col.typeName is None:
            existing = table.columns[col.colname]  # PARTITION OF: (col WITH OPTIONS NOT NULL)
        else:
            existing = Column(
                col.colname, _type_name(col.typeName), False, self.where(_loc(col, at))
            )
            existing.not_null = existing.type_name in _IMPLICIT_NOT_NULL
            table.columns[col.colname] = existing
        for con in col.constraints or ():
            if con.contype in (ConstrType.CONSTR_NOTNULL, ConstrType.CONSTR_IDENTITY):
                existing.not_null = True
            elif con.contype == ConstrType.CONSTR_NULL:
                existing.not_null = False
            elif con.contype == ConstrType.CONSTR_PRIMARY:
                existing.not_null = True
                table.primary_key = (col.colname,)

    def add_constraint(self, table: Table, con: Any, at: int) -> None:
        if con.contype != ConstrType.CONSTR_PRIMARY:
            return
        keys = tuple(k.sval for k in con.keys or ())
        for k in keys:
            col = table.columns.get(k)
            if col is None:
                raise DdlError(
                    f"{self.where(_loc(con, at))}: primary key of {table.name} names column "
                    f"{k!r}, which the table does not have"
                )
            col.not_null = True
        table.primary_key = keys

    def alter(self, stmt: Any, at: int) -> None:
        if stmt.objtype not in (ObjectType.OBJECT_TABLE, None):
            return
        table = self.table(stmt.relation, at, missing_ok=bool(stmt.missing_ok))
        if table is None:
            return
        for cmd in stmt.cmds or ():
            sub = cmd.subtype
            if sub == AlterTableType.AT_AddColumn and isinstance(cmd.def_, ast.ColumnDef):
                if cmd.def_.colname in table.columns and cmd.missing_ok:
                    continue
                self.add_column(table, cmd.def_, at)
            elif sub == AlterTableType.AT_AddConstraint and isinstance(cmd.def_, ast.Constraint):
                self.add_constraint(table, cmd.def_, at)
            elif sub in (AlterTableType.AT_SetNotNull, AlterTableType.AT_DropNotNull):
                col = self.column(table, cmd.name, at)
                col.not_null = sub == AlterTableType.AT_SetNotNull
            elif sub == AlterTableType.AT_DropColumn:
                if cmd.name not in table.columns and cmd.missing_ok:
                    continue
                self.column(table, cmd.name, at)
                del table.columns[cmd.name]
                if cmd.name in table.primary_key:
                    table.primary_key = ()
            elif sub == AlterTableType.AT_AlterColumnType and isinstance(cmd.def_, ast.ColumnDef):
                self.column(table, cmd.name, at).type_name = _type_name(cmd.def_.typeName)
            elif sub == AlterTableType.AT_AttachPartition and isinstance(
                cmd.def_, ast.PartitionCmd
            ):
                part = self.table(cmd.def_.name, at)
                assert part is not None
                part.partition_of = table.name
                table.partitions.append(part.name)
            elif sub == AlterTableType.AT_DetachPartition and isinstance(
                cmd.def_, ast.PartitionCmd
            ):
                pname = self.table_name(cmd.def_.name)
                if pname in table.partitions:
                    table.partitions.remove(pname)

    def column(self, table: Table, name: str, at: int) -> Column:
        col = table.columns.get(name)
        if col is None:
            raise DdlError(
                f"{self.where(at)}: column {name!r} of {table.name} is altered here but the "
                "table has no such column"
            )
        return col

    def rename(self, stmt: Any, at: int) -> None:
        if stmt.relation is None:
            return
        table = self.table(stmt.relation, at, missing_ok=bool(stmt.missing_ok))
        if table is None:
            return
        if stmt.renameType == ObjectType.OBJECT_TABLE:
            del self.schema.tables[table.name]
            table.name = TableName(table.name.schema, stmt.newname)
            self.schema.tables[table.name] = table
        elif stmt.renameType == ObjectType.OBJECT_COLUMN:
            col = self.column(table, stmt.subname, at)
            del table.columns[col.name]
            col.name = stmt.newname
            table.columns[col.name] = col
            table.primary_key = tuple(
                stmt.newname if k == stmt.subname else k for k in table.primary_key
            )

    def drop(self, stmt: Any) -> None:
        if stmt.removeType != ObjectType.OBJECT_TABLE:
            return
        for obj in stmt.objects or ():
            parts = [s.sval for s in obj]
            name = (
                TableName(*parts[-2:])
                if len(parts) > 1
                else TableName(self.schema.search_path, parts[0])
            )
            self.schema.tables.pop(name, None)

    def set_var(self, stmt: Any) -> None:
        if stmt.name == "search_path" and stmt.args:
            self._set_path(_const_text(stmt.args[0]))

    def set_config(self, stmt: Any) -> None:
        # pg_dump writes: SELECT pg_catalog.set_config('search_path', '', false);
        for target in stmt.targetList or ():
            call: Any = getattr(target, "val", None)
            if not isinstance(call, ast.FuncCall):
                continue
            name = [str(s.sval) for s in call.funcname or ()]
            args = call.args or ()
            is_path = len(args) >= 2 and _const_text(args[0]) == "search_path"
            if name[-1:] == ["set_config"] and is_path:
                self._set_path((_const_text(args[1]) or "").split(",")[0].strip())

    def _set_path(self, first: str | None) -> None:
        if not first:
            self.schema.search_path = DEFAULT_SCHEMA  # '' (pg_dump): names are all qualified
            return
        try:
            self.schema.search_path = TableName.parse(f"{first}.x").schema
        except SpecError:
            self.schema.search_path = DEFAULT_SCHEMA


def _loc(node: Any, default: int) -> int:
    loc = getattr(node, "location", None)
    return loc if isinstance(loc, int) and loc >= 0 else default


def _type_name(tn: ast.TypeName | None) -> str:
    if tn is None or not tn.names:
        return "?"
    last = str(tn.names[-1].sval).lower()
    return _TYPE_ALIASES.get(last, last)


def _const_text(node: Any) -> str | None:
    if isinstance(node, ast.A_Const) and isinstance(node.val, ast.String):
        return str(node.val.sval)
    if isinstance(node, ast.String):
        return str(node.sval)
    return None


def read_ddl(paths: Iterable[str | Path]) -> Schema:
    """Replay the CREATE/ALTER TABLE statements of ``paths``, in order, into a :class:`Schema`."""
    schema = Schema()
    for path in paths:
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise DdlError(f"cannot read schema file {p}: {exc.strerror or exc}") from exc
        schema.files.append(str(p))
        schema.search_path = DEFAULT_SCHEMA  # each file starts like a fresh psql session
        _Reader(schema, text, str(p)).read()
    return schema


def read_ddl_text(text: str, filename: str = "<sql>") -> Schema:
    """Like :func:`read_ddl` for SQL held in a string."""
    schema = Schema(files=[filename])
    _Reader(schema, text, filename).read()
    return schema


# ------------------------------------------------------------------------------- validation


def validate(spec: FenceSpec, schema: Schema) -> list[str]:
    """Check ``spec`` against the tables of ``schema``; return notes for the DBA.

    Raises :class:`DdlError` naming the table or column and where it is defined.
    """
    table = schema.get(spec.table)
    if table is None:
        where = ", ".join(schema.files) or "the schema files"
        near = [str(t) for t in schema.tables if t.name == spec.table.name]
        hint = f" (found {', '.join(near)}: qualify the table name)" if near else ""
        raise DdlError(f"table {spec.table} is not defined in {where}{hint}")
    if table.partition_of is not None:
        raise DdlError(
            f"{table.where}: {spec.table} is a partition of {table.partition_of}; protect the "
            "partitioned table instead (its partitions are covered)"
        )
    for key in spec.key:
        col = table.columns.get(key)
        if col is None:
            raise DdlError(
                f"{table.where}: table {spec.table} has no column {key!r} for the key "
                f"(columns: {', '.join(table.columns) or 'none'})"
            )
        if not col.not_null:
            raise DdlError(
                f"{col.where}: key column {key!r} of {spec.table} is nullable; key columns must be "
                "NOT NULL or part of the primary key "
                f"(ALTER TABLE {spec.table} ALTER COLUMN {quote_ident(key)} SET NOT NULL)"
            )
    notes: list[str] = []
    if spec.scope is Scope.ROW:
        col = table.columns.get(spec.column)
        if col is not None and col.type_name != "int8":
            raise DdlError(
                f"{col.where}: fence column {spec.column!r} of {spec.table} already exists with "
                f"type {col.type_name}, not bigint; choose another name with --column"
            )
        if col is not None:
            notes.append(f"fence column {spec.column!r} already exists (bigint): reused")
    if table.partitioned:
        parts = ", ".join(map(str, table.partitions)) or "none defined in these files"
        notes.append(
            f"{spec.table} is partitioned (partitions: {parts}); at apply time every existing "
            "partition also gets fencekit's statement triggers (statements naming a partition "
            "do not fire the parent's). Partitions attached later need `fencekit protect` "
            "re-run; `fencekit status` reports them."
        )
    if not table.primary_key and spec.scope is Scope.ROW:
        notes.append(f"{spec.table} has no primary key: rejection messages cannot name the row")
    return notes


# ------------------------------------------------------------------------------- parse check


def parse_check(sql: str) -> None:
    """Raise :class:`DdlError` unless ``sql`` parses, PL/pgSQL bodies included.

    pglast parses a function body only as a string, so every ``CREATE FUNCTION ... LANGUAGE
    plpgsql`` and ``DO`` block is parsed again with the PL/pgSQL parser.
    """
    try:
        stmts = pglast.parse_sql(sql)
    except pglast.parser.ParseError as exc:
        raise DdlError(f"generated SQL does not parse: {exc}") from exc
    for raw in stmts:
        stmt = raw.stmt
        start = raw.stmt_location or 0
        text = sql[start : start + raw.stmt_len] if raw.stmt_len else sql[start:]
        if isinstance(stmt, ast.CreateFunctionStmt) and _language(stmt.options) == "plpgsql":
            _plpgsql(text)
        elif isinstance(stmt, ast.DoStmt) and _language(stmt.args) in (None, "plpgsql"):
            body = next((str(o.arg.sval) for o in stmt.args or () if o.defname == "as"), "")
            _plpgsql(
                "CREATE FUNCTION fencekit_do() RETURNS void LANGUAGE plpgsql AS "
                + _dollar_quote(body)
            )


def _language(options: Any) -> str | None:
    for opt in options or ():
        if opt.defname == "language":
            return str(opt.arg.sval).lower()
    return None


def _dollar_quote(body: str) -> str:
    tag = "$fencekit_check$"
    while tag in body:
        tag = tag[:-1] + "x$"
    return f"{tag}{body}{tag}"


def _plpgsql(create_function: str) -> None:
    try:
        pglast.parse_plpgsql(create_function)
    except pglast.parser.ParseError as exc:
        if "LookupExplicitNamespace" in str(exc):
            # The offline parser resolves types in pg_catalog and public only: a body using
            # the row type of one of fencekit's own tables cannot be compiled here. PostgreSQL
            # compiles it when the script creates the function (check_function_bodies).
            return
        head = re.sub(r"\s+", " ", create_function)[:120]
        raise DdlError(f"PL/pgSQL body does not parse ({exc}): {head}") from exc
