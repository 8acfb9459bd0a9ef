"""``GrantFencekitWriter(role)`` / ``RevokeFencekitWriter(role)``: migration operations for the
grant a role needs to take leases from fencekit's issuer, and what ``makemigrations`` writes for
the roles ``settings.FENCEKIT_WRITER_ROLES`` names.

    # settings.py
    FENCEKIT_WRITER_ROLES = ["billing_app"]

``makemigrations`` adds ``GrantFencekitWriter("billing_app")`` to the migration of the first app
(by label) that has a fenced model, once: the migrations already hold the roles granted
(a grant and no later revoke). A role removed from the setting is not revoked: write
``RevokeFencekitWriter`` yourself.
"""

from __future__ import annotations

import re
from typing import Any

from django.db.migrations.operations.base import Operation

from fencekit.ident import quote_ident

__all__ = ["GrantFencekitWriter", "RevokeFencekitWriter", "add_writer_grants"]

WRITER = "fencekit_writer"
SETTING = "FENCEKIT_WRITER_ROLES"


def _role(role: str) -> str:
    if not isinstance(role, str) or not role:
        raise ValueError(f"a role name is a non-empty string, got {role!r}")
    if role.lower() in ("public", "current_user", "current_role", "session_user"):
        raise ValueError(
            f"{role!r} is not a role to grant {WRITER} to: name the application's login role"
        )
    return role


class _WriterOperation(Operation):
    reversible = True
    reduces_to_sql = True
    verb = ""

    def __init__(self, role: str) -> None:
        self.role = _role(role)

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return (type(self).__qualname__, [self.role], {})

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass  # a role's membership is no part of the models' state

    def _sql(self, grant: bool) -> str:
        role = quote_ident(self.role)
        return f"GRANT {WRITER} TO {role}" if grant else f"REVOKE {WRITER} FROM {role}"

    def _execute(self, schema_editor: Any, grant: bool) -> None:
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(self._sql(grant), params=None)

    @property
    def migration_name_fragment(self) -> str:
        return f"{self.verb}_fencekit_writer_{re.sub(r'[^a-z0-9_]+', '_', self.role.lower())}"


class GrantFencekitWriter(_WriterOperation):
    """``GRANT fencekit_writer TO role``: the role may take leases from fencekit's issuer."""

    verb = "grant"

    def database_forwards(self, app_label: str, schema_editor: Any, *states: Any) -> None:
        self._execute(schema_editor, grant=True)

    def database_backwards(self, app_label: str, schema_editor: Any, *states: Any) -> None:
        self._execute(schema_editor, grant=False)

    def describe(self) -> str:
        return f"Grant {WRITER} to role {self.role}"


class RevokeFencekitWriter(_WriterOperation):
    """``REVOKE fencekit_writer FROM role`` (the reverse of :class:`GrantFencekitWriter`)."""

    verb = "revoke"

    def database_forwards(self, app_label: str, schema_editor: Any, *states: Any) -> None:
        self._execute(schema_editor, grant=False)

    def database_backwards(self, app_label: str, schema_editor: Any, *states: Any) -> None:
        self._execute(schema_editor, grant=True)

    def describe(self) -> str:
        return f"Revoke {WRITER} from role {self.role}"


def _granted(graph: Any) -> set[str]:
    """The roles the project's migrations grant fencekit_writer to (and do not revoke)."""
    net: dict[str, int] = {}
    for migration in getattr(graph, "nodes", {}).values():
        for op in getattr(migration, "operations", ()):
            if isinstance(op, GrantFencekitWriter):
                net[op.role] = net.get(op.role, 0) + 1
            elif isinstance(op, RevokeFencekitWriter):
                net[op.role] = net.get(op.role, 0) - 1
    return {role for role, n in net.items() if n > 0}


def add_writer_grants(detector: Any, graph: Any, fenced_apps: list[str]) -> None:
    """Called by fencekit's autodetector: a ``GrantFencekitWriter`` for each role of
    ``settings.FENCEKIT_WRITER_ROLES`` no migration grants yet, in the first fenced app, after
    the ``fencekit`` app's migrations (the core creates the role)."""
    from django.conf import settings  # read when makemigrations runs, not at import
    from django.db.migrations.autodetector import OperationDependency

    roles = getattr(settings, SETTING, ())
    if isinstance(roles, str):
        roles = [roles]
    if not roles or not fenced_apps:
        return
    granted = _granted(graph)
    app_label = sorted(fenced_apps)[0]
    after_core = OperationDependency("fencekit", "__first__", None, OperationDependency.Type.CREATE)
    for role in roles:
        if role not in granted:
            detector.add_operation(app_label, GrantFencekitWriter(role), dependencies=[after_core])
