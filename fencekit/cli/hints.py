"""Write out the fencekit commands the catalog names as fixes (:class:`fencekit.catalog.Command`).

The catalog says *which* command fixes a drift or an error; how that command is spelled on
this command line is the CLI's business, and lives here only.
"""

from __future__ import annotations

import shlex
from typing import Any

from fencekit.catalog import Action, Command, Drift, Status
from fencekit.errors import CatalogError

__all__ = ["error_text", "fix_text", "status_document"]


def command_text(c: Command) -> str:
    """The command line of ``c``, with ``--dsn DSN`` where it needs a database."""
    spec = c.spec
    if c.action is Action.INSTALL:
        return "fencekit install --dsn DSN"
    if c.action is Action.ALLOW:
        return f"fencekit allow {c.sha256} --dsn DSN"
    assert spec is not None, c
    if c.action is Action.PROTECT:
        return f"fencekit protect {spec.cli_args()} --dsn DSN"
    if c.action is Action.UNPROTECT:
        return f"fencekit unprotect {spec.table} --dsn DSN"
    if c.action is Action.RENAME:
        new = shlex.quote(str(c.new_name))
        return f"fencekit rename {shlex.quote(str(spec.table))} {new} --dsn DSN"
    # MOVE
    args = spec.cli_args()
    return f"`fencekit move {args}` (review the script first: `fencekit sql move {args} --dsn DSN`)"


def fix_text(d: Drift) -> str:
    """A drift's fix, its command written out."""
    return d.fix_text(command_text)


def error_text(exc: CatalogError) -> str:
    """A catalog error and, when a fencekit command fixes it, that command."""
    c = exc.command
    if c is None:
        return str(exc)
    if c.action is Action.INSTALL:
        return (
            f"{exc}: run `{command_text(c)}` (it installs or upgrades in place; as a DBA: psql "
            "-v ON_ERROR_STOP=1 -f sql/fencekit-install.sql)"
        )
    if c.action is Action.MOVE:
        return f"{exc}, with {command_text(c)}"
    return f"{exc}: run `{command_text(c)}`"


def status_document(st: Status) -> dict[str, Any]:
    """``fencekit status --json``."""
    return st.as_dict(command_text)
