"""Typed fencing errors, translated from driver errors by SQLSTATE.

PostgreSQL raises every rejection with a SQLSTATE in class ``YF`` (docs/dev/contracts.md), a
one-line JSON ``DETAIL`` and the standard diagnostic fields. :func:`translate` turns a psycopg
error, or SQLAlchemy's wrapper around one (``exc.orig``), into the matching :class:`FenceError`.

This module imports neither psycopg nor SQLAlchemy: the DBA path and the CLI use it without them,
so driver errors are read by duck typing (``.sqlstate``, ``.diag``).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

__all__ = [
    "BIGINT_MAX",
    "SQLSTATES",
    "BypassRefusedError",
    "CommitOutcomeUnknownError",
    "FenceError",
    "FenceUsageError",
    "InvalidTokenError",
    "IssuerMismatchError",
    "LeaseMismatchError",
    "MalformedTokenError",
    "MissingTokenError",
    "ReusedTokenError",
    "StaleTokenError",
    "TokenNotSetError",
    "commit_outcome_unknown",
    "translate",
    "validate_token",
]

BIGINT_MAX = 2**63 - 1

_NO_TOKEN_ADVICE = (
    "no fencing token is set: wrap the write in `with fencekit.fencing(token):` or install the "
    "session plugin (fencekit.orm.install / fencekit.psycopg.install), or pass the token to "
    "fencekit.psycopg.transaction(conn, token)"
)


class FenceError(Exception):
    """A write PostgreSQL rejected because of its fencing token (SQLSTATE class ``YF``).

    Attributes come from the error's DETAIL JSON, falling back to the diagnostic fields:
    ``table`` is schema-qualified (``public.billing_summary``), ``key`` a dict of key column to
    text value (``None`` for table fences), ``token``/``fence`` ints or ``None`` when unknown.
    ``orig`` is the driver error (also chained as ``__cause__``).
    """

    sqlstate: ClassVar[str] = "YF000"
    reason: ClassVar[str] = "usage"
    advice: ClassVar[str] = ""

    def __init__(
        self,
        message: str,
        *,
        table: str | None = None,
        key: dict[str, Any] | None = None,
        token: int | None = None,
        fence: int | None = None,
        resource: str | None = None,
        hint: str | None = None,
        column: str | None = None,
        constraint: str | None = None,
        detail: dict[str, Any] | None = None,
        orig: BaseException | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.table = table
        self.key = key
        self.token = token
        self.fence = fence
        self.resource = resource
        self.hint = hint
        self.column = column
        self.constraint = constraint
        self.detail = detail or {}
        self.orig = orig

    def __str__(self) -> str:
        parts = [self.message]
        if self.hint:
            parts.append(f"HINT: {self.hint}")
        elif self.advice:  # the database's hint is more specific; ours fills in when absent
            parts.append(self.advice)
        return "\n".join(parts)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(sqlstate={self.sqlstate!r}, table={self.table!r}, "
            f"key={self.key!r}, token={self.token!r}, fence={self.fence!r})"
        )


class StaleTokenError(FenceError):
    """The token is lower than the fence: a newer lease holder has written since."""

    sqlstate = "YF001"
    reason = "stale"
    advice = (
        "a newer lease holder has written: stop working on this resource and re-acquire the "
        "lease; retrying with the same token will fail again"
    )


class ReusedTokenError(FenceError):
    """The token equals the fence and the table's policy is 'each token writes once'."""

    sqlstate = "YF002"
    reason = "reused"
    advice = "this table accepts each token once (on_equal = reject): acquire a new lease"


class MissingTokenError(FenceError):
    """No token was set and the table rejects unfenced writes."""

    sqlstate = "YF003"
    reason = "missing"
    advice = _NO_TOKEN_ADVICE


class MalformedTokenError(FenceError):
    """``fencekit.token`` is not a canonical positive bigint."""

    sqlstate = "YF004"
    reason = "malformed"
    advice = (
        "fencekit.token must be a positive integer within bigint, e.g. "
        "SELECT set_config('fencekit.token', '34', true)"
    )


class BypassRefusedError(FenceError):
    """``fencekit.bypass`` was set by a role that is not a member of ``fencekit_admin``."""

    sqlstate = "YF005"
    reason = "bypass_refused"
    advice = "only members of the fencekit_admin role may bypass fencing; ask your DBA"


class LeaseMismatchError(FenceError):
    """The token is not the current lease holder's (lease-bound fences)."""

    sqlstate = "YF006"
    reason = "lease_mismatch"
    advice = "the lease was lost or renewed with another token: re-acquire the lease"


class IssuerMismatchError(FenceError):
    """The token was tagged with another issuer than the resource's."""

    sqlstate = "YF007"
    reason = "issuer_mismatch"
    advice = "tokens from different issuers are not comparable: use the resource's issuer"


class FenceUsageError(FenceError):
    """Any other fencekit usage error raised by the database (e.g. a NULL key value)."""

    sqlstate = "YF000"
    reason = "usage"


SQLSTATES: dict[str, type[FenceError]] = {
    cls.sqlstate: cls
    for cls in (
        FenceUsageError,
        StaleTokenError,
        ReusedTokenError,
        MissingTokenError,
        MalformedTokenError,
        BypassRefusedError,
        LeaseMismatchError,
        IssuerMismatchError,
    )
}


class CommitOutcomeUnknownError(Exception):
    """The connection was lost while a fenced transaction's COMMIT was in flight.

    Not a rejection (no SQLSTATE, not a :class:`FenceError`) and not a success: the server may
    have committed before it went away (a primary killed after its WAL flush, a failover) or
    not. ``token``/``issuer`` are the token the transaction ran under; ``orig`` is the driver
    error. Find out before acting: read back what the transaction wrote, on the new primary.
    Retrying under the same token is safe only if the transaction is idempotent (an upsert of
    the same values, a write guarded by a unique key); otherwise it may apply twice. See
    docs/ha.md#a-commit-in-flight-at-a-failover.
    """

    def __init__(
        self,
        message: str = "",
        *,
        token: int | None = None,
        issuer: str | None = None,
        orig: BaseException | None = None,
    ) -> None:
        message = message or (
            "the connection was lost while COMMIT was in flight: the transaction may or may not "
            f"have committed (token {token}); read back before retrying"
        )
        super().__init__(message)
        self.token = token
        self.issuer = issuer
        self.orig = orig


def commit_outcome_unknown(
    exc: BaseException, token: int | None = None, issuer: str | None = None
) -> CommitOutcomeUnknownError | None:
    """The outcome-unknown error for ``exc`` raised by a COMMIT, or None when ``exc`` says
    what happened (a server error with a SQLSTATE: the transaction was rolled back).

    A lost connection has no SQLSTATE (psycopg), or one of class 08 (connection exception) or
    57P (the server shutting down or crashing under the client).
    """
    driver = _driver_error(exc) or getattr(exc, "orig", None) or exc
    sqlstate = getattr(driver, "sqlstate", None)
    lost = sqlstate is None or sqlstate.startswith(("08", "57P"))
    operational = any(c.__name__ == "OperationalError" for c in type(driver).__mro__)
    if not (lost and operational):
        return None
    error = CommitOutcomeUnknownError(token=token, issuer=issuer, orig=driver)
    error.__cause__ = exc
    return error


class InvalidTokenError(ValueError):
    """A token rejected on the client, before anything was sent to the database."""


class TokenNotSetError(InvalidTokenError):
    """A fenced operation was asked for, but no token was given and no scope is active."""

    def __init__(self, message: str = _NO_TOKEN_ADVICE) -> None:
        super().__init__(message)


def validate_token(token: object) -> int:
    """Return ``token`` if it is a valid fencing token, else raise :class:`InvalidTokenError`.

    Valid: an ``int`` (not ``bool``), ``1 <= token <= 2**63 - 1`` (PostgreSQL ``bigint``).
    """
    if isinstance(token, bool) or not isinstance(token, int):
        raise InvalidTokenError(
            f"a fencing token must be an int, got {type(token).__name__} {token!r}; "
            "convert it where the lease is granted (e.g. int(lease.token))"
        )
    if token <= 0:
        raise InvalidTokenError(f"a fencing token must be positive, got {token}")
    if token > BIGINT_MAX:
        raise InvalidTokenError(
            f"a fencing token must fit in PostgreSQL bigint (<= {BIGINT_MAX}), got {token}"
        )
    return token


# ---------------------------------------------------------------- translation


def _driver_error(exc: BaseException) -> BaseException | None:
    """The psycopg error inside ``exc``: itself, or SQLAlchemy's ``.orig``."""
    for candidate in (exc, getattr(exc, "orig", None)):
        if candidate is not None and isinstance(getattr(candidate, "sqlstate", None), str):
            return candidate
    return None


def _as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def _parse_detail(text: object) -> dict[str, Any]:
    if not isinstance(text, str) or not text.strip().startswith("{"):
        return {}
    try:
        parsed = json.loads(text)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def translate(exc: BaseException) -> FenceError | None:
    """The :class:`FenceError` for a psycopg (or SQLAlchemy-wrapped) error, else ``None``.

    The returned error has ``__cause__`` set to ``exc`` so a plain ``raise`` keeps the chain;
    ``raise translate(e) from e`` is equivalent.
    """
    if isinstance(exc, FenceError):
        return exc
    driver = _driver_error(exc)
    if driver is None:
        return None
    sqlstate: str = getattr(driver, "sqlstate", "")
    cls = SQLSTATES.get(sqlstate)
    if cls is None:
        return None
    diag = getattr(driver, "diag", None)
    detail = _parse_detail(getattr(diag, "message_detail", None))
    message = getattr(diag, "message_primary", None) or str(driver).splitlines()[0]
    table = detail.get("table")
    if not isinstance(table, str):
        schema, name = getattr(diag, "schema_name", None), getattr(diag, "table_name", None)
        table = f"{schema}.{name}" if schema and name else name
    key = detail.get("key")
    resource = detail.get("resource")
    error = cls(
        str(message),
        table=table,
        key=key if isinstance(key, dict) else None,
        token=_as_int(detail.get("token")),
        fence=_as_int(detail.get("fence")),
        resource=resource if isinstance(resource, str) else None,
        hint=getattr(diag, "message_hint", None),
        column=getattr(diag, "column_name", None),
        constraint=getattr(diag, "constraint_name", None),
        detail=detail,
        orig=driver,
    )
    error.__cause__ = exc
    return error
