"""Fence specs: the one data object that describes how a table is protected.

Pure data and validation, no I/O. Every renderer (CLI, alembic operations, autogenerate, DBA
scripts) reads a :class:`FenceSpec`; nothing else decides what gets generated.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Literal

from fencekit.errors import SpecError
from fencekit.ident import quote_ident

__all__ = [
    "DEFAULT_COLUMN",
    "DEFAULT_SCHEMA",
    "FenceSpec",
    "Scope",
    "SpecError",
    "TableName",
    "check_shared_resources",
]

DEFAULT_SCHEMA = "public"
DEFAULT_COLUMN = "fencekit_fence"
MAX_IDENT_BYTES = 63

OnMissing = Literal["reject", "allow"]
OnEqual = Literal["accept", "reject"]


class Scope(str, Enum):
    """What one fence guards."""

    ROW = "row"  # a fence column on each row
    KEY = "key"  # rows sharing key values share one fence in fencekit.fences
    TABLE = "table"  # one fence for the whole table, checked once per statement

    def __str__(self) -> str:
        return self.value


# An identifier as SQL writes it: a quoted name ("" escapes a quote) or a bare word.
_NAME = r'"(?:[^"]|"")+"|[^\s."]+'
_QUALIFIED = re.compile(rf"\s*({_NAME})\s*(?:\.\s*({_NAME})\s*)?")
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_BARE = re.compile(r"[A-Za-z_\u0080-\U0010ffff][A-Za-z0-9_$\u0080-\U0010ffff]*")


def _unquote(part: str, whole: str) -> str:
    if part.startswith('"'):
        name = part[1:-1].replace('""', '"')
    elif _BARE.fullmatch(part):
        # PostgreSQL folds unquoted identifiers to lower case (ASCII letters only).
        name = part.translate(
            str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
        )
    else:
        raise SpecError(f"invalid identifier {part!r} in {whole!r}: quote it with double quotes")
    _check_length(name)
    return name


def _check_length(name: str) -> None:
    if not name:
        raise SpecError("empty identifier")
    if "\x00" in name:
        raise SpecError(f"identifier {name!r} contains a NUL byte")
    if len(name.encode()) > MAX_IDENT_BYTES:
        raise SpecError(
            f"identifier {name!r} is {len(name.encode())} bytes; PostgreSQL keeps at most "
            f"{MAX_IDENT_BYTES} (it would be truncated and could collide)"
        )


@dataclass(frozen=True, order=True)
class TableName:
    """A schema-qualified table name, unquoted (the real characters of each part)."""

    schema: str
    name: str

    def __post_init__(self) -> None:
        _check_length(self.schema)
        _check_length(self.name)

    @classmethod
    def parse(cls, text: str, default_schema: str = DEFAULT_SCHEMA) -> TableName:
        """Parse a name as SQL writes it: ``t``, ``s.t``, ``"My Schema"."My Table"``.

        An unqualified name gets ``default_schema``.
        """
        m = _QUALIFIED.fullmatch(text)
        if not m:
            raise SpecError(
                f"cannot read table name {text!r}: write it as SQL does, e.g. billing_summary, "
                'public.billing_summary or "My Schema"."My Table"'
            )
        first, second = m.group(1), m.group(2)
        if second is None:
            return cls(default_schema, _unquote(first, text))
        return cls(_unquote(first, text), _unquote(second, text))

    @property
    def sql(self) -> str:
        """The name quoted for SQL (quotes only where PostgreSQL needs them)."""
        return f"{quote_ident(self.schema)}.{quote_ident(self.name)}"

    @property
    def dotted(self) -> str:
        """Unquoted ``schema.table``: the default resource name of an unnamed fence."""
        return f"{self.schema}.{self.name}"

    def __str__(self) -> str:
        return self.sql


@dataclass(frozen=True)
class FenceSpec:
    """How one table is protected.

    ``resource`` names a fence shared by several tables (key and table scope); by default the
    resource is the table itself. ``issuer`` binds the resource to one token issuer: tokens of
    different issuers are never comparable.
    """

    table: TableName
    scope: Scope = Scope.ROW
    key: tuple[str, ...] = ()
    resource: str | None = None
    on_missing: OnMissing = "reject"
    on_equal: OnEqual = "accept"
    column: str = DEFAULT_COLUMN
    lease_bound: bool = False
    issuer: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.table, TableName):
            raise SpecError(f"table must be a TableName, not {type(self.table).__name__}")
        if self.table.schema == "fencekit":
            raise SpecError(
                f"{self.table} is one of fencekit's own tables: fencekit never protects them "
                "(only the DBA and fencekit_admin may write them)"
            )
        scope = Scope(self.scope)
        object.__setattr__(self, "scope", scope)
        object.__setattr__(self, "key", tuple(self.key))
        if scope is Scope.KEY:
            if not self.key:
                raise SpecError(f"a key fence on {self.table} needs at least one key column")
            if len(set(self.key)) != len(self.key):
                raise SpecError(f"key columns of {self.table} repeat: {', '.join(self.key)}")
        elif self.key:
            raise SpecError(f"key columns only make sense with scope 'key' (got scope '{scope}')")
        for col in (*self.key, self.column):
            _check_length(col)
        if self.resource is not None:
            if scope is Scope.ROW:
                raise SpecError("a named resource needs scope 'key' or 'table', not 'row'")
            if not self.resource.strip() or len(self.resource) > 200:
                raise SpecError("a resource name must be 1 to 200 characters, not blank")
        if self.on_missing not in ("reject", "allow"):
            raise SpecError(f"on_missing must be 'reject' or 'allow', not {self.on_missing!r}")
        if self.on_equal not in ("accept", "reject"):
            raise SpecError(f"on_equal must be 'accept' or 'reject', not {self.on_equal!r}")
        if self.issuer is not None and not re.fullmatch(r"[a-z][a-z0-9_-]{0,30}", self.issuer):
            raise SpecError(
                f"issuer must be a short lower-case name like 'etcd', not {self.issuer!r}"
            )
        if self.lease_bound and scope is Scope.ROW:
            raise SpecError("lease-bound fences need scope 'key' or 'table'")
        if self.lease_bound and ":" in self.resource_name:
            # A key's lease is named resource:key: with a ':' in the resource, two resources'
            # keys could name one lease (billing:eu key 42, billing key eu:42).
            raise SpecError(
                f"a lease-bound fence's resource names its leases as resource:key, so it may "
                f"not hold ':' ({self.resource_name!r}): two keys could name one lease; "
                "pick a resource name without ':' (--resource)"
            )
        if scope is Scope.KEY and self.column != DEFAULT_COLUMN:
            raise SpecError("the fence column only applies to row fences")

    @property
    def resource_name(self) -> str:
        """The resource whose fence this table uses (key and table scope)."""
        return self.resource if self.resource is not None else self.table.dotted

    def with_changes(self, **changes: Any) -> FenceSpec:
        return replace(self, **changes)

    def describe(self) -> str:
        """A short human description, for tables and messages."""
        parts = [f"{self.scope} fence"]
        if self.scope is Scope.KEY:
            parts.append(f"key ({', '.join(self.key)})")
        if self.scope is Scope.ROW:
            parts.append(f"column {self.column}")
        if self.resource is not None:
            parts.append(f"resource {self.resource}")
        if self.issuer is not None:
            parts.append(f"issuer {self.issuer}")
        if self.on_missing != "reject":
            parts.append(f"on_missing={self.on_missing}")
        if self.on_equal != "accept":
            parts.append(f"on_equal={self.on_equal}")
        return ", ".join(parts)

    def cli_args(self) -> str:
        """The ``fencekit protect`` arguments that reproduce this spec, shell-quoted (the
        generated scripts' hints print the same through the core's ``fencekit.spec_args``)."""
        args = [str(self.table)]
        if self.scope is Scope.TABLE:
            args += ["--scope", "table"]
        for k in self.key:
            args += ["--key", k]
        if self.resource is not None:
            args += ["--resource", self.resource]
        if self.on_missing != "reject":
            args += ["--on-missing", self.on_missing]
        if self.on_equal != "accept":
            args += ["--on-equal", self.on_equal]
        if self.scope is Scope.ROW and self.column != DEFAULT_COLUMN:
            args += ["--column", self.column]
        if self.issuer is not None:
            args += ["--issuer", self.issuer]
        return " ".join(shlex.quote(a) for a in args)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; the registry stores it and alembic renders it."""
        d: dict[str, Any] = {
            "table": {"schema": self.table.schema, "name": self.table.name},
            "scope": self.scope.value,
            "key": list(self.key),
            "resource": self.resource,
            "on_missing": self.on_missing,
            "on_equal": self.on_equal,
            "column": self.column,
            "lease_bound": self.lease_bound,
            "issuer": self.issuer,
        }
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FenceSpec:
        try:
            t = d["table"]
            table = TableName(t["schema"], t["name"]) if isinstance(t, dict) else TableName.parse(t)
            return cls(
                table=table,
                scope=Scope(d.get("scope", "row")),
                key=tuple(d.get("key") or ()),
                resource=d.get("resource"),
                on_missing=d.get("on_missing", "reject"),
                on_equal=d.get("on_equal", "accept"),
                column=d.get("column", DEFAULT_COLUMN),
                lease_bound=bool(d.get("lease_bound", False)),
                issuer=d.get("issuer"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, SpecError):
                raise
            raise SpecError(f"invalid fence spec {d!r}: {exc}") from exc


def check_shared_resources(specs: Iterable[FenceSpec]) -> None:
    """Refuse a resource shared by a key fence and a table fence (``SpecError``).

    A table fence is its resource's key ``''``, which a key fence's keys share: a writer of
    one table would advance the other's fence, and lock its holder out. Protect makes the same
    check against the tables already protected (``fencekit.register_table``).
    """
    seen: dict[str, FenceSpec] = {}
    for spec in specs:
        if spec.scope is Scope.ROW:
            continue
        other = seen.setdefault(spec.resource_name, spec)
        if other.scope is not spec.scope:
            key, table = (other, spec) if other.scope is Scope.KEY else (spec, other)
            raise SpecError(
                f"resource {spec.resource_name!r} cannot be shared by the key fence of "
                f"{key.table} and the table fence of {table.table}: a table fence is the "
                "resource's key '', so writers of one table would advance the other's fence; "
                "give one of them another resource name"
            )
