"""What the catalog reports: drift kinds, drifts, protected tables, the status of a database.

No CLI text here: a drift that a fencekit command fixes carries that command as a
:class:`Command` and writes ``{command}`` where it goes in its ``fix``; the CLI renders it
(``fencekit.cli.hints``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any

import psycopg

from fencekit import sqlgen
from fencekit.spec import FenceSpec, TableName

__all__ = [
    "Action",
    "Command",
    "Conn",
    "Drift",
    "DriftKind",
    "ProtectedTable",
    "Repairs",
    "Status",
]

Conn = psycopg.Connection[Any]

#: Where a drift's fix names the fencekit command that fixes it.
COMMAND = "{command}"


class DriftKind(str, Enum):
    """Every kind of drift the status report holds (the DBA guide lists each)."""

    # the core
    CORE_MISSING = "core_missing"
    CORE_OUTDATED = "core_outdated"
    ORPHANED_FENCES = "orphaned_fences"
    # ownership of fencekit's objects
    OWNER_CHANGED = "owner_changed"
    OWNER_UNPRIVILEGED = "owner_unprivileged"
    OWNER_ROLE_MISSING = "owner_role_missing"
    # server settings that switch fencing off
    REPLICATION_ROLE_GRANTED = "replication_role_granted"
    REPLICATION_ROLE_DEFAULT = "replication_role_default"
    TOKEN_SETTING = "token_setting"
    # a protected table against what its spec generates
    TEMPLATE_OUTDATED = "template_outdated"
    TEMPLATE_UNKNOWN = "template_unknown"
    TABLE_RENAMED = "table_renamed"
    TABLE_MISSING = "table_missing"
    TABLE_OID_STALE = "table_oid_stale"
    TRIGGER_MISSING = "trigger_missing"
    TRIGGER_DISABLED = "trigger_disabled"
    TRIGGER_REPLICA_ONLY = "trigger_replica_only"
    TRIGGER_ALWAYS = "trigger_always"
    TRIGGER_CHANGED = "trigger_changed"
    FUNCTION_MISSING = "function_missing"
    FUNCTION_CHANGED = "function_changed"
    FUNCTION_MISMATCH = "function_mismatch"
    FENCE_COLUMN_MISSING = "fence_column_missing"
    FENCE_COLUMN_ALTERED = "fence_column_altered"
    FENCE_COLUMN_SWAPPED = "fence_column_swapped"
    FENCE_DEFAULT_MISSING = "fence_default_missing"
    KEY_TYPE_CHANGED = "key_type_changed"
    KEY_COLUMN_SWAPPED = "key_column_swapped"
    KEY_EXPRESSION_CHANGED = "key_expression_changed"
    # descendants and ancestors
    PARTITION_TRIGGERS_MISSING = "partition_triggers_missing"
    CHILD_TRIGGERS_MISSING = "child_triggers_missing"
    UNPROTECTED_ANCESTOR = "unprotected_ancestor"
    PROTECTED_ANCESTOR = "protected_ancestor"
    CHILD_OTHER_PARENT = "child_other_parent"
    # code fencekit did not generate
    FOREIGN_TRIGGER_FIRST = "foreign_trigger_first"
    FOREIGN_TRIGGER_FENCE_COLUMN = "foreign_trigger_fence_column"
    FOREIGN_TRIGGER = "foreign_trigger"
    FENCE_DEFAULT_FOREIGN = "fence_default_foreign"
    FOREIGN_DEFAULT = "foreign_default"
    FOREIGN_COLUMN_TYPE = "foreign_column_type"
    FOREIGN_CONSTRAINT = "foreign_constraint"
    FOREIGN_INDEX = "foreign_index"
    FOREIGN_POLICY = "foreign_policy"
    FOREIGN_RULE = "foreign_rule"
    FOREIGN_CASCADE = "foreign_cascade"
    FOREIGN_VIEW = "foreign_view"
    FOREIGN_CODE = "foreign_code"
    FOREIGN_FUNCTION = "foreign_function"

    def __str__(self) -> str:
        return self.value


class Action(str, Enum):
    """A fencekit command that fixes something the catalog found."""

    INSTALL = "install"  # install or upgrade the core
    PROTECT = "protect"  # protect the table again with its spec: re-creates what is missing
    UNPROTECT = "unprotect"  # unprotect the table (the fix then protects it again)
    RENAME = "rename"  # move the protection to the table's new name
    MOVE = "move"  # move the table to another spec, its fences carried
    ALLOW = "allow"  # allow reviewed code by its hash

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Command:
    """The command of an :class:`Action`, with what it needs to be written out."""

    action: Action
    spec: FenceSpec | None = None
    #: RENAME: the table's new name.
    new_name: TableName | None = None
    #: ALLOW: the code hash.
    sha256: str | None = None


@dataclass(frozen=True)
class Drift:
    """One way a protected table (or the database) differs from what fencekit expects."""

    kind: DriftKind
    object: str
    message: str
    #: What to do: SQL or prose; ``{command}`` stands for ``command``, rendered by the CLI.
    fix: str
    #: Every object concerned, when one drift groups several (ownership: one line per owner).
    objects: tuple[str, ...] = ()
    #: Code fencekit did not generate: the hash of what it runs (an ALLOW command takes it).
    sha256: str | None = None
    command: Command | None = None

    def fix_text(self, render: Callable[[Command], str]) -> str:
        """``fix`` with its command written out by ``render``."""
        if self.command is None:
            return self.fix
        return self.fix.replace(COMMAND, render(self.command))

    def as_dict(self, render: Callable[[Command], str]) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "object": self.object,
            "message": self.message,
            "fix": self.fix_text(render),
            "objects": list(self.objects),
            "sha256": self.sha256,
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

    def as_dict(self, render: Callable[[Command], str]) -> dict[str, Any]:
        return {
            "table": self.spec.table.dotted,
            "schema": self.spec.table.schema,
            "name": self.spec.table.name,
            "spec": self.spec.as_dict(),
            "template_version": self.template_version,
            "tag": self.tag,
            "protected_at": iso(self.protected_at),
            "drift": [d.as_dict(render) for d in self.drift],
            "rejections": dict(self.rejections),
            "last_rejected_at": iso(self.last_rejected_at),
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

    def as_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "lowered": self.lowered,
            "last_at": iso(self.last_at),
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

    def all_drift(self) -> list[Drift]:
        return list(self.drift) + [d for t in self.tables for d in t.drift]

    def as_dict(self, render: Callable[[Command], str]) -> dict[str, Any]:
        return {
            "core": {
                "installed": self.core_version is not None,
                "version": self.core_version,
                "latest": sqlgen.CORE_VERSION,
            },
            "template_version": sqlgen.TEMPLATE_VERSION,
            "drift": self.has_drift,
            "core_drift": [d.as_dict(render) for d in self.drift],
            "warnings": list(self.warnings),
            "repairs": self.repairs.as_dict() if self.repairs is not None else None,
            "tables": [t.as_dict(render) for t in self.tables],
        }


def iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None
