"""Read a live database: installed core version, protected tables, drift, rejection counts.

What *should* exist comes from :func:`fencekit.sqlgen.table_objects` for the spec and template
version stored in ``fencekit.protected``; the catalog only compares it with ``pg_catalog``. It
never writes, except :func:`allow_code` and :func:`revoke_code` (the allow-list of reviewed
code). Everything it reads is readable by any role that can connect.

One job per module:

- :mod:`.model`: the drift kinds (:class:`DriftKind`), drifts, protected tables, statuses;
- :mod:`.registry`: the core and the registry, resolving tables, checking a spec;
- :mod:`.drift`: a protected table's objects against its spec; descendants and ancestors;
- :mod:`.bound`: the columns its objects read by name against those protect bound them to;
- :mod:`.triggers`: triggers that are not fencekit's, in firing order;
- :mod:`.code`: the rest of the code fencekit did not generate (:mod:`.codeinfo` reads it);
- :mod:`.allowed`: the allow-list of reviewed code;
- :mod:`.ownership`: who owns fencekit's objects;
- :mod:`.settings`: server settings that weaken or switch off fencing;
- :mod:`.counts`: rejections, lateness, repairs;
- :mod:`.report`: ``status``, all of it together.

No CLI text lives here: a fix that is a fencekit command is a :class:`Command`; the CLI
renders it (``fencekit.cli.hints``).
"""

from __future__ import annotations

from fencekit.catalog.allowed import allow_code, allowed_code, revoke_code
from fencekit.catalog.drift import table_drift
from fencekit.catalog.model import (
    Action,
    Command,
    Drift,
    DriftKind,
    ProtectedTable,
    Repairs,
    Status,
)
from fencekit.catalog.registry import (
    check_spec,
    core_version,
    existing_table,
    protected_table,
    protected_tables,
    registered,
    require_core,
    resolve_table,
    search_path,
)
from fencekit.catalog.report import status
from fencekit.errors import CatalogError

__all__ = [
    "Action",
    "CatalogError",
    "Command",
    "Drift",
    "DriftKind",
    "ProtectedTable",
    "Repairs",
    "Status",
    "allow_code",
    "allowed_code",
    "check_spec",
    "core_version",
    "existing_table",
    "protected_table",
    "protected_tables",
    "registered",
    "require_core",
    "resolve_table",
    "revoke_code",
    "search_path",
    "status",
    "table_drift",
]
