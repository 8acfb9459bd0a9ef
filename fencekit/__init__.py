"""fencekit: make PostgreSQL reject stale writes with fencing tokens.

The public API, kept small. Integrations are separate modules imported on demand, so that the
DBA path works without SQLAlchemy or alembic installed: ``fencekit.psycopg``, ``fencekit.orm``,
``fencekit.alembic_plugin``, ``fencekit.leases``, ``fencekit.metrics``.
"""

from importlib.metadata import PackageNotFoundError, version

from fencekit.context import current_issuer, current_token, fencing
from fencekit.errors import (
    BypassRefusedError,
    FenceError,
    FenceUsageError,
    InvalidTokenError,
    IssuerMismatchError,
    LeaseMismatchError,
    MalformedTokenError,
    MissingTokenError,
    ReusedTokenError,
    StaleTokenError,
    TokenNotSetError,
    validate_token,
)
from fencekit.spec import FenceSpec, Scope, SpecError, TableName

try:
    # One place for the version: pyproject.toml, read back from the installed distribution.
    __version__ = version("pg-fencekit")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "BypassRefusedError",
    "FenceError",
    "FenceSpec",
    "FenceUsageError",
    "InvalidTokenError",
    "IssuerMismatchError",
    "LeaseMismatchError",
    "MalformedTokenError",
    "MissingTokenError",
    "ReusedTokenError",
    "Scope",
    "SpecError",
    "StaleTokenError",
    "TableName",
    "TokenNotSetError",
    "__version__",
    "current_issuer",
    "current_token",
    "fencing",
    "validate_token",
]
