"""``status``: everything ``fencekit status`` shows, put together from the other modules."""

from __future__ import annotations

from fencekit import sqlgen
from fencekit.catalog.allowed import allowed_hashes
from fencekit.catalog.codeinfo import Inspector
from fencekit.catalog.counts import add_lateness, add_rejections, recent_repairs
from fencekit.catalog.drift import orphaned_fences, table_drift
from fencekit.catalog.foreign import foreign_function_drift
from fencekit.catalog.model import COMMAND, Action, Command, Conn, Drift, DriftKind, Status
from fencekit.catalog.ownership import ownership_drift
from fencekit.catalog.registry import core_version, protected_tables
from fencekit.catalog.settings import durability_warnings, setting_drift, subscription_warnings

__all__ = ["status"]


def status(conn: Conn) -> Status:
    """Everything ``fencekit status`` shows (``core_missing`` drift without the core).

    Code on protected tables whose hash is in ``fencekit.allowed_code`` (``fencekit allow``)
    is not reported.
    """
    version = core_version(conn)
    if version is None:
        missing = Drift(
            DriftKind.CORE_MISSING,
            "fencekit",
            "fencekit's core is not installed in this database",
            f"{COMMAND} (or psql -v ON_ERROR_STOP=1 -f fencekit-install.sql)",
            command=Command(Action.INSTALL),
        )
        return Status(None, [], [missing])
    core_drift: list[Drift] = []
    if version < sqlgen.CORE_VERSION:
        core_drift.append(
            Drift(
                DriftKind.CORE_OUTDATED,
                "fencekit",
                f"the core is version {version}; this fencekit installs {sqlgen.CORE_VERSION}",
                f"{COMMAND} (upgrades in place)",
                command=Command(Action.INSTALL),
            )
        )
    # A function fencekit did not create is to be dropped, never handed to another owner.
    foreign = foreign_function_drift(conn)
    core_drift += foreign
    core_drift += ownership_drift(conn, skip={d.object for d in foreign})
    core_drift += orphaned_fences(conn)
    core_drift += setting_drift(conn)
    tables = protected_tables(conn)
    allowed = allowed_hashes(conn)
    inspector = Inspector(conn)
    for pt in tables:
        pt.drift = table_drift(conn, pt, allowed, inspector)
    add_rejections(conn, tables)
    add_lateness(conn, tables)
    warnings = durability_warnings(conn) + subscription_warnings(conn, tables)
    return Status(version, tables, core_drift, warnings, repairs=recent_repairs(conn))
