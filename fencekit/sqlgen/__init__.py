"""Render fence specs and the core schema to SQL. Pure: no I/O besides reading packaged files.

This is the only generator: the CLI, the alembic operations, autogenerate and the DBA scripts
all call it, so the SQL a DBA reviews is the SQL that runs. One module per scope:

- :mod:`.statement`: the statement check every protected table has;
- :mod:`.row`, :mod:`.key`, :mod:`.table`: what each scope adds;
- :mod:`.protect`: the per-table objects assembled into idempotent protect / unprotect DDL;
- :mod:`.rename`: moving a protection to a table's new name;
- :mod:`.change`: the one fence-change model (old spec -> new spec, either side may be
  none), which alembic, Django and ``fencekit move`` all call; :mod:`.move`: its move, the
  fences carried to another scope, key, resource or fence column;
- :mod:`.core`: the core schema; :mod:`.script`: whole psql scripts;
- :mod:`.objects`, :mod:`.common`, :mod:`.text`: the shared pieces (objects and their stamps,
  names, SQL text helpers).

See docs/dev/architecture.md for the data flow.
"""

from fencekit.sqlgen.change import FenceChange, change_statements, render_move
from fencekit.sqlgen.core import CORE_VERSION, core_guard, install_statements, uninstall_statements
from fencekit.sqlgen.move import is_move
from fencekit.sqlgen.objects import TEMPLATE_VERSION, Function, TableObjects, Trigger
from fencekit.sqlgen.protect import (
    protect_statements,
    table_objects,
    trigger_stamp,
    unprotect_statements,
)
from fencekit.sqlgen.rename import rename_statements
from fencekit.sqlgen.script import (
    DEFAULT_LOCK_TIMEOUT,
    render_install,
    render_protect,
    render_rename,
    render_uninstall,
    render_unprotect,
)

__all__ = [
    "CORE_VERSION",
    "DEFAULT_LOCK_TIMEOUT",
    "TEMPLATE_VERSION",
    "FenceChange",
    "Function",
    "TableObjects",
    "Trigger",
    "change_statements",
    "core_guard",
    "install_statements",
    "is_move",
    "protect_statements",
    "rename_statements",
    "render_install",
    "render_move",
    "render_protect",
    "render_rename",
    "render_uninstall",
    "render_unprotect",
    "table_objects",
    "trigger_stamp",
    "uninstall_statements",
    "unprotect_statements",
]
