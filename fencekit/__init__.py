"""fencekit: make PostgreSQL reject stale writes with fencing tokens.

The public API, kept small. Integrations are separate modules imported on demand, so that the
DBA path works without SQLAlchemy or alembic installed: ``fencekit.psycopg``,
``fencekit.psycopg2``, ``fencekit.asyncpg``, ``fencekit.sqlalchemy``, ``fencekit.alembic_plugin``,
``fencekit.leases``, ``fencekit.metrics``.

Every exception fencekit raises derives from :class:`FencekitError`; database rejections from
:class:`FenceError` (docs/errors-and-metrics.md).
"""

import contextlib
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fencekit.context import current_issuer, current_token, fencing
from fencekit.errors import (
    BypassRefusedError,
    CommitOutcomeUnknownError,
    FenceError,
    FencekitError,
    FenceUsageError,
    IssuerMismatchError,
    LeaseMismatchError,
    MalformedTokenError,
    MissingTokenError,
    ReusedTokenError,
    SpecError,
    StaleTokenError,
    validate_token,
)
from fencekit.spec import FenceSpec, Scope, TableName

# psycopg 3 is a dependency: register the rejection classes with it now (any fencekit import
# runs this first), so that psycopg raises them itself, from any connection, with or without an
# adapter installed. Guarded: a tool that only renders SQL can run where the driver is missing.
with contextlib.suppress(ImportError):
    from fencekit import _psycopg_errors  # noqa: F401

try:
    # One place for the version: pyproject.toml, read back from the installed distribution.
    __version__ = version("pg-fencekit")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"


def __getattr__(name: str) -> Any:
    # fencekit.claim / fencekit.async_claim, imported on first use: fencekit.leases needs the
    # driver, and `import fencekit` must not (the DBA path, fencekit.errors alone).
    import importlib

    if name in ("claim", "async_claim"):
        return getattr(importlib.import_module("fencekit.leases.claim"), name)
    if name == "rejections":
        return importlib.import_module("fencekit.metrics").rejections
    raise AttributeError(f"module 'fencekit' has no attribute {name!r}")


__all__ = [
    "BypassRefusedError",
    "CommitOutcomeUnknownError",
    "FenceError",
    "FenceSpec",
    "FenceUsageError",
    "FencekitError",
    "IssuerMismatchError",
    "LeaseMismatchError",
    "MalformedTokenError",
    "MissingTokenError",
    "ReusedTokenError",
    "Scope",
    "SpecError",
    "StaleTokenError",
    "TableName",
    "__version__",
    "async_claim",
    "claim",
    "current_issuer",
    "current_token",
    "fencing",
    "rejections",
    "validate_token",
]
