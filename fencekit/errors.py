"""fencekit's exceptions: one root, :class:`FencekitError`; typed rejections by SQLSTATE.

PostgreSQL raises every rejection with a SQLSTATE in class ``YF`` (docs/dev/contracts.md), a
one-line JSON ``DETAIL`` and the standard diagnostic fields. Each reason has its class under
:class:`FenceError`. psycopg 3 raises them itself (:mod:`fencekit._psycopg_errors` registers
them); :func:`translate` turns a psycopg2 or asyncpg error, or SQLAlchemy's wrapper around one
(``exc.orig``), into the matching class.

Driver errors are read by duck typing (``.sqlstate``/``.pgcode``, ``.diag``, asyncpg's fields):
this module imports no driver (pure data, the lowest layer). ``import fencekit`` registers the
psycopg classes (:mod:`fencekit._psycopg_errors`).
"""

from __future__ import annotations

import functools
import json
import types
from collections.abc import Callable
from typing import Any, ClassVar

__all__ = [
    "BIGINT_MAX",
    "SQLSTATES",
    "BypassRefusedError",
    "CatalogError",
    "ChaosSetupError",
    "CommitOutcomeUnknownError",
    "DdlError",
    "DemoError",
    "EmbeddedServerError",
    "FenceError",
    "FenceUsageError",
    "FencekitError",
    "FencingAssertionError",
    "HistoryError",
    "IssuerError",
    "IssuerMismatchError",
    "IssuerNotReachableError",
    "IssuerUnavailableError",
    "LeaseError",
    "LeaseLostError",
    "LeaseMismatchError",
    "LeaseTimeoutError",
    "LeaseWaitError",
    "MalformedTokenError",
    "MissingTokenError",
    "ReusedTokenError",
    "SetupError",
    "SpecError",
    "StaleTokenError",
    "UsageError",
    "WorkerError",
    "commit_outcome_unknown",
    "driver_classes",
    "fields_of",
    "translate",
    "validate_token",
]

BIGINT_MAX = 2**63 - 1

_NO_TOKEN_ADVICE = (
    "no fencing token is set: wrap the write in `with fencekit.fencing(token):` with the "
    "driver's adapter installed (fencekit.psycopg / psycopg2 / asyncpg / sqlalchemy .install), "
    "or pass the token to the adapter's transaction(conn, token)"
)


class FencekitError(Exception):
    """The root of every exception fencekit raises: ``except fencekit.FencekitError`` catches
    rejections, lease and issuer errors, spec and catalog errors alike."""


class FenceError(FencekitError):
    """A write refused because of its fencing token: by PostgreSQL (SQLSTATE class ``YF``,
    ``orig`` is the driver's error), or before anything was sent, by fencekit (``orig`` is None:
    no token in scope, a token that is not a positive bigint).

    Attributes come from the error's DETAIL JSON, falling back to the diagnostic fields:
    ``table`` is schema-qualified (``public.billing_summary``), ``key`` a dict of key column to
    text value (``None`` for table fences), ``token``/``fence`` ints or ``None`` when unknown.

    Raised by a driver fencekit registers with (psycopg 3; asyncpg once ``fencekit.asyncpg`` is
    imported) the error is an instance of a subclass that is also that driver's error class, so
    ``except psycopg.Error`` catches it too (docs/errors-and-metrics.md).
    """

    sqlstate: ClassVar[str] = "YF000"
    reason: ClassVar[str] = "usage"
    advice: ClassVar[str] = ""

    message: str
    table: str | None
    key: dict[str, Any] | None
    token: int | None
    fence: int | None
    resource: str | None
    hint: str | None
    column: str | None
    constraint: str | None
    detail: dict[str, Any]
    orig: BaseException | None

    def __init__(
        self,
        message: str = "",
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
        message = message or self.advice
        super().__init__(message)
        self._set_fields(
            message,
            table=table,
            key=key,
            token=token,
            fence=fence,
            resource=resource,
            hint=hint,
            column=column,
            constraint=constraint,
            detail=detail,
            orig=orig,
        )

    def _set_fields(
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
        # Separate from __init__: the driver subclasses (fencekit._psycopg_errors, ...) are
        # built by the driver's own constructor and fill these from its diagnostics.
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

    def as_dict(self) -> dict[str, Any]:
        """The rejection as plain data (for logs and JSON): reason, SQLSTATE and the fields."""
        return {
            "reason": self.reason,
            "sqlstate": self.sqlstate,
            "message": self.message,
            "table": self.table,
            "key": self.key,
            "token": self.token,
            "fence": self.fence,
            "resource": self.resource,
            "hint": self.hint,
            "column": self.column,
            "constraint": self.constraint,
            "detail": self.detail,
        }


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
    """No token was set and the table rejects unfenced writes; or, raised before sending, a
    fenced operation was asked for with no token given and no :func:`fencing` scope active."""

    sqlstate = "YF003"
    reason = "missing"
    advice = _NO_TOKEN_ADVICE

    def _set_fields(self, message: str, **fields: Any) -> None:
        super()._set_fields(message, **fields)
        if self.hint is not None:  # the database's hint is generic; this process knows more
            self.hint = _missing_token_cause()


# The current token, as fencekit.context tells it. context sits above this module (it imports
# validate_token), so it registers its reader here when it is imported; until then none is current.
def _no_token() -> int | None:
    return None


_current_token: Callable[[], int | None] = _no_token


def _missing_token_cause() -> str:
    """Which of the two usual causes a rejected tokenless write had, judged where the driver
    raised it (the writing thread or task): no token was current, or one was and the
    connection did not send it."""
    token = _current_token()
    if token is None:
        return (
            "this write ran outside any lease or fencing() scope: no token was current in this "
            "thread or task. Take the lease around the write (`with Lease(...)` makes its token "
            "current) or wrap it in `with fencekit.fencing(token):`; a scope follows the work "
            "into asyncio tasks and asyncio.to_thread, not into threads you start yourself"
        )
    return (
        f"token {token} was current here, but the connection that wrote did not send it: "
        "install the driver's adapter on that connection, engine or pool "
        "(fencekit.psycopg / psycopg2 / asyncpg / sqlalchemy .install)"
    )


class MalformedTokenError(FenceError):
    """``fencekit.token`` is not a canonical positive bigint; or, raised before sending
    (:func:`validate_token`), a token that is not an int between 1 and ``2**63 - 1``."""

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


def _fill(body: dict[str, Any], namespace: dict[str, Any]) -> None:
    namespace.update(body)


def driver_classes(
    base: type[BaseException],
    module: str,
    *,
    driver_first: bool = False,
    code_keyword: str | None = None,
) -> dict[str, type[FenceError]]:
    """One class per rejection reason that is fencekit's class *and* a driver's error ``base``,
    named as fencekit's (``StaleTokenError``...), for ``module`` to publish as its own.

    Every driver gets its classes here, so they cannot drift apart. ``driver_first`` puts
    ``base`` first in the MRO, for a driver that builds the error itself with its own
    constructor (psycopg 3, asyncpg); otherwise fencekit's constructor and fields come first
    and the adapter builds the error from the driver's (psycopg2, Django). ``code_keyword``:
    the class keyword by which the driver registers a class for a SQLSTATE (psycopg's
    ``code=``); each class also carries ``sqlstate`` in its body, which is how asyncpg's
    metaclass registers it.
    """
    made: dict[str, type[FenceError]] = {}
    for reason in SQLSTATES.values():
        bases = (base, reason) if driver_first else (reason, base)
        keywords = {code_keyword: reason.sqlstate} if code_keyword else {}
        body = {
            "__doc__": reason.__doc__,
            "__module__": module,
            "__qualname__": reason.__name__,
            "sqlstate": reason.sqlstate,
        }
        made[reason.__name__] = types.new_class(
            reason.__name__, bases, keywords, functools.partial(_fill, body)
        )
    return made


class CommitOutcomeUnknownError(FencekitError):
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


# Connection lost, by driver: psycopg and psycopg2 raise OperationalError (with no SQLSTATE, or
# class 08 / 57P); asyncpg raises ConnectionDoesNotExistError, or an InterfaceError-derived
# "connection is closed", or a PostgresConnectionError (class 08).
_LOST_CLASSES = ("OperationalError", "ConnectionDoesNotExistError", "PostgresConnectionError")


def commit_outcome_unknown(
    exc: BaseException, token: int | None = None, issuer: str | None = None
) -> CommitOutcomeUnknownError | None:
    """The outcome-unknown error for ``exc`` raised by a COMMIT, or None when ``exc`` says
    what happened (a server error with a SQLSTATE: the transaction was rolled back).

    A lost connection has no SQLSTATE (psycopg), or one of class 08 (connection exception) or
    57P (the server shutting down or crashing under the client).
    """
    candidates = _candidates(exc)  # SQLAlchemy's asyncpg errors wrap asyncpg's as __cause__
    if any(
        state is not None and not state.startswith(("08", "57P"))
        for state in map(_sqlstate, candidates)
    ):
        return None  # the server answered: the transaction was rolled back
    driver = next(
        (
            c
            for c in candidates
            if isinstance(c, ConnectionError)
            or {k.__name__ for k in type(c).__mro__}.intersection(_LOST_CLASSES)
        ),
        None,
    )
    if driver is None:
        return None
    error = CommitOutcomeUnknownError(token=token, issuer=issuer, orig=driver)
    error.__cause__ = exc
    return error


def validate_token(token: object) -> int:
    """Return ``token`` if it is a valid fencing token, else raise :class:`MalformedTokenError`.

    Valid: an ``int`` (not ``bool``), ``1 <= token <= 2**63 - 1`` (PostgreSQL ``bigint``). The
    same rule the database applies to ``fencekit.token`` (YF004), checked before sending.
    """
    if isinstance(token, bool) or not isinstance(token, int):
        raise MalformedTokenError(
            f"a fencing token must be an int, got {type(token).__name__} {token!r}; "
            "convert it where the lease is granted (e.g. int(lease.token))"
        )
    if token <= 0:
        raise MalformedTokenError(f"a fencing token must be positive, got {token}")
    if token > BIGINT_MAX:
        raise MalformedTokenError(
            f"a fencing token must fit in PostgreSQL bigint (<= {BIGINT_MAX}), got {token}"
        )
    return token


# ---------------------------------------------------------------- translation
#
# Three drivers, two shapes of diagnostics: psycopg 3 and psycopg2 carry them in ``.diag``
# (``message_primary``, ``schema_name``, ...) with the SQLSTATE in ``.sqlstate`` / ``.pgcode``;
# asyncpg sets them on the error itself (``message``, ``detail``, ``schema_name``, ...).


def _sqlstate(exc: BaseException) -> str | None:
    for attribute in ("sqlstate", "pgcode"):
        value = getattr(exc, attribute, None)
        if isinstance(value, str):
            return value
    return None


def _candidates(exc: BaseException) -> list[BaseException]:
    """``exc``, SQLAlchemy's ``.orig`` inside it, and what each was raised from: SQLAlchemy's
    asyncpg dialect raises its own DBAPI-style error (a SQLSTATE, no diagnostics) from
    asyncpg's, which has them."""
    found: list[BaseException] = []
    for candidate in (exc, getattr(exc, "orig", None)):
        for one in (candidate, getattr(candidate, "__cause__", None)):
            if isinstance(one, BaseException) and one not in found:
                found.append(one)
    return found


def _has_diagnostics(exc: BaseException) -> bool:
    return hasattr(exc, "diag") or "schema_name" in getattr(exc, "__dict__", {})


def _driver_error(exc: BaseException) -> BaseException | None:
    """The driver error inside ``exc`` that best describes it: one with diagnostics first."""
    with_state = [c for c in _candidates(exc) if _sqlstate(c) is not None]
    return next((c for c in with_state if _has_diagnostics(c)), None) or next(
        iter(with_state), None
    )


def _diagnostics(driver: BaseException) -> dict[str, Any]:
    """The error fields of ``driver``, named as psycopg names them, whatever the driver."""
    names = (
        "message_primary",
        "message_detail",
        "message_hint",
        "schema_name",
        "table_name",
        "column_name",
        "constraint_name",
    )
    diag = getattr(driver, "diag", None)
    if diag is not None:  # psycopg 3, psycopg2
        return {name: getattr(diag, name, None) for name in names}
    fields = vars(driver) if hasattr(driver, "__dict__") else {}  # asyncpg: set on the error
    return {
        "message_primary": fields.get("message"),
        "message_detail": fields.get("detail"),
        "message_hint": fields.get("hint"),
        **{name: fields.get(name) for name in names[3:]},
    }


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


def fields_of(driver: BaseException) -> tuple[str, dict[str, Any]]:
    """(message, FenceError keyword arguments) read from a driver error's diagnostics."""
    diag = _diagnostics(driver)
    detail = _parse_detail(diag["message_detail"])
    message = diag["message_primary"] or (str(driver).splitlines() or [""])[0]
    table = detail.get("table")
    if not isinstance(table, str):
        schema, name = diag["schema_name"], diag["table_name"]
        table = f"{schema}.{name}" if schema and name else name
    key = detail.get("key")
    resource = detail.get("resource")
    return str(message), {
        "table": table,
        "key": key if isinstance(key, dict) else None,
        "token": _as_int(detail.get("token")),
        "fence": _as_int(detail.get("fence")),
        "resource": resource if isinstance(resource, str) else None,
        "hint": diag["message_hint"],
        "column": diag["column_name"],
        "constraint": diag["constraint_name"],
        "detail": detail,
    }


def translate(exc: BaseException) -> FenceError | None:
    """The :class:`FenceError` for a driver error (psycopg 3, psycopg2, asyncpg, or SQLAlchemy's
    wrapper around one), else ``None``.

    An error that already is a :class:`FenceError` (psycopg 3 raises fencekit's classes itself)
    is returned as it is. Otherwise the returned error has ``__cause__`` set to ``exc`` so a
    plain ``raise`` keeps the chain; ``raise translate(e) from e`` is equivalent.
    """
    for candidate in _candidates(exc):
        if isinstance(candidate, FenceError):
            return candidate
    driver = _driver_error(exc)
    if driver is None:
        return None
    cls = SQLSTATES.get(_sqlstate(driver) or "")
    if cls is None:
        return None
    message, fields = fields_of(driver)
    error = cls(message, orig=driver, **fields)
    error.__cause__ = exc
    return error


# ---------------------------------------------------------------- the other exceptions
# Those of the spec, the catalog, the issuers and leases, the tools and the testing kit: each is
# raised by one module, defined here so that every exception fencekit raises is on this page.


class SpecError(FencekitError, ValueError):
    """A fence spec or a table name is invalid; the message says which part and why."""


class DdlError(FencekitError, ValueError):
    """A schema file cannot be read, or the spec does not fit the tables it defines."""


class CatalogError(FencekitError):
    """The database does not fit the request (core missing, table missing, bad key column).

    ``command``: the fencekit command that would fix it (the CLI appends it as a hint)."""

    def __init__(self, message: str, command: Any = None) -> None:
        super().__init__(message)
        self.command = command


class EmbeddedServerError(FencekitError, RuntimeError):
    """The throwaway PostgreSQL server could not be started or stopped."""


class IssuerError(FencekitError):
    """Base class of issuer errors."""


class IssuerUnavailableError(IssuerError):
    """The issuer could not be reached in time.

    Not a verdict on the lease: the attempt may or may not have taken effect, and a held lease
    may still be alive until its deadline.
    """


class LeaseError(FencekitError):
    """Base class of lease errors (a lease used while not held, ...)."""


class LeaseTimeoutError(LeaseError, TimeoutError):
    """The resource stayed held by someone else for the whole wait."""


class LeaseLostError(LeaseError):
    """The lease was lost: renewal was refused or failed until the lease expired.

    Stop working on the resource. Writes made with the old token are rejected by fenced tables
    once another holder wrote with a newer token.
    """

    # grant: the fencekit.leases.Grant that was lost (Any: errors sit below the leases layer).
    def __init__(self, grant: Any, reason: str) -> None:
        super().__init__(
            f"lease on {grant.resource!r} (token {grant.token}, holder {grant.holder!r}) "
            f"lost: {reason}"
        )
        self.grant = grant
        self.reason = reason


class HistoryError(FencekitError, ValueError):
    """A history cannot be read or checked (the message says where and why)."""


class ChaosSetupError(FencekitError, RuntimeError):
    """The run could not prepare what it needs on the server (e.g. its worker role)."""


class FencingAssertionError(FencekitError, AssertionError):
    """A fencing assertion failed; the message carries the report (:func:`describe`)."""


class WorkerError(FencekitError, AssertionError):
    """A worker did not do what the test waited for (the message carries its output)."""


class SetupError(FencekitError, RuntimeError):
    """The fenced database could not be built (the message says which step and why)."""


class LeaseWaitError(FencekitError, AssertionError):
    """The lease did not expire in time, or there was no lease to wait for."""


class UsageError(FencekitError):
    """Bad command-line input detected after parsing; exit code 2."""


class DemoError(FencekitError, RuntimeError):
    """The demo could not run (server, privileges, a worker that misbehaved)."""


class IssuerNotReachableError(IssuerError):
    """The demo's external issuer is not installed (client library) or does not answer."""
