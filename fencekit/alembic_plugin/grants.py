"""``op.grant_fencekit_writer(role)`` / ``op.revoke_fencekit_writer(role)``, their renderers, and
the autogenerate comparator that adds the grant for each role ``env.py`` names.

A role that takes leases from fencekit's built-in issuer (``fencekit.acquire`` / ``renew`` /
``release``) must be a member of ``fencekit_writer``. Name the application's roles in ``env.py``
and autogenerate writes the grant into the migration that needs it::

    context.configure(..., fencekit_writer_roles=["billing_app"])

A role already a member (directly) is left alone; a role dropped from the list is not revoked
(a DBA may have granted it by hand): write ``op.revoke_fencekit_writer`` yourself.

Importing :mod:`fencekit.alembic_plugin` registers all of this.
"""

from __future__ import annotations

import logging
from typing import Any

from alembic.autogenerate import renderers
from alembic.autogenerate.api import AutogenContext
from alembic.operations import MigrateOperation, Operations
from alembic.operations.ops import UpgradeOps

from fencekit.alembic_plugin.registry import pinned_connection
from fencekit.ident import quote_ident

__all__ = ["GrantWriterOp", "RevokeWriterOp", "compare_grants", "log_detected"]

WRITER = "fencekit_writer"
OPTION = "fencekit_writer_roles"
_IMPORT = "import fencekit.alembic_plugin  # noqa: F401  (registers op.*_fence)"
# alembic's own autogenerate logger: its ini's `alembic` logger shows what it detects at INFO.
log = logging.getLogger("alembic.autogenerate.compare")


def _role(role: str) -> str:
    if not isinstance(role, str) or not role:
        raise ValueError(f"a role name is a non-empty string, got {role!r}")
    if role.lower() in ("public", "current_user", "current_role", "session_user"):
        raise ValueError(
            f"{role!r} is not a role to grant {WRITER} to: name the application's login role"
        )
    return role


@Operations.register_operation("grant_fencekit_writer")
class GrantWriterOp(MigrateOperation):
    """``GRANT fencekit_writer TO role``: the role may take leases from fencekit's issuer."""

    def __init__(self, role: str) -> None:
        self.role = _role(role)

    @classmethod
    def grant_fencekit_writer(cls, operations: Operations, role: str) -> None:
        """Let ``role`` take leases from fencekit's built-in issuer."""
        operations.invoke(cls(role))

    def reverse(self) -> RevokeWriterOp:
        return RevokeWriterOp(self.role)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("grant_fencekit_writer", self.role)


@Operations.register_operation("revoke_fencekit_writer")
class RevokeWriterOp(MigrateOperation):
    """``REVOKE fencekit_writer FROM role`` (the reverse of :class:`GrantWriterOp`)."""

    def __init__(self, role: str) -> None:
        self.role = _role(role)

    @classmethod
    def revoke_fencekit_writer(cls, operations: Operations, role: str) -> None:
        """Take back what :meth:`GrantWriterOp.grant_fencekit_writer` gave ``role``."""
        operations.invoke(cls(role))

    def reverse(self) -> GrantWriterOp:
        return GrantWriterOp(self.role)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("revoke_fencekit_writer", self.role)


@Operations.implementation_for(GrantWriterOp)
def _grant(operations: Operations, operation: GrantWriterOp) -> None:
    operations.execute(f"GRANT {WRITER} TO {quote_ident(operation.role)}")


@Operations.implementation_for(RevokeWriterOp)
def _revoke(operations: Operations, operation: RevokeWriterOp) -> None:
    operations.execute(f"REVOKE {WRITER} FROM {quote_ident(operation.role)}")


def _render(autogen_context: AutogenContext, name: str, role: str) -> str:
    autogen_context.imports.add(_IMPORT)
    prefix = autogen_context.opts.get("alembic_module_prefix", "op.")
    return f"{prefix}{name}({role!r})"


@renderers.dispatch_for(GrantWriterOp)
def _render_grant(autogen_context: AutogenContext, op: GrantWriterOp) -> str:
    return _render(autogen_context, "grant_fencekit_writer", op.role)


@renderers.dispatch_for(RevokeWriterOp)
def _render_revoke(autogen_context: AutogenContext, op: RevokeWriterOp) -> str:
    return _render(autogen_context, "revoke_fencekit_writer", op.role)


def compare_grants(
    autogen_context: AutogenContext, upgrade_ops: UpgradeOps, schemas: set[str | None]
) -> None:
    """Add ``grant_fencekit_writer`` for each role of ``fencekit_writer_roles`` (env.py's
    ``context.configure``) that is not a member of fencekit_writer yet, after the fence
    operations (which install the core that creates the role)."""
    from sqlalchemy import text

    roles = autogen_context.opts.get(OPTION) or ()
    if isinstance(roles, str):
        roles = [roles]
    connection = autogen_context.connection
    assert connection is not None, "autogenerate always has a connection"
    for role in roles:
        with pinned_connection(connection):
            member, exists = connection.execute(
                text(
                    "SELECT EXISTS (SELECT FROM pg_catalog.pg_auth_members m "
                    "JOIN pg_catalog.pg_roles r ON r.oid = m.member "
                    "JOIN pg_catalog.pg_roles g ON g.oid = m.roleid "
                    "WHERE r.rolname = :role AND g.rolname = :writer), "
                    "EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = :role)"
                ),
                {"role": role, "writer": WRITER},
            ).one()
        if member:
            continue
        if not exists:
            log.warning(
                "Role %r named in %s does not exist (yet): the migration's grant fails "
                "unless it is created first",
                role,
                OPTION,
            )
        upgrade_ops.ops.append(GrantWriterOp(role))


def log_detected(upgrade_ops: UpgradeOps) -> None:
    """Log each fencekit operation autogenerate added, as alembic logs what it detects."""
    from fencekit.alembic_plugin import ops as fence_ops

    for op in upgrade_ops.ops:
        if type(op).__module__ not in (fence_ops.__name__, __name__):
            continue  # alembic's own operations: alembic logs those
        diff = op.to_diff_tuple()
        if isinstance(op, (GrantWriterOp, RevokeWriterOp)):
            log.info("Detected %s to role %r", diff[0], op.role)
        elif len(diff) >= 3:
            log.info("Detected %s on '%s.%s'", diff[0], diff[1], diff[2])
        else:
            log.info("Detected %s", " ".join(str(d) for d in diff))
