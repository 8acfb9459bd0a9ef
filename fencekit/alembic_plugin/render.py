"""Write fence operations into migration files: explicit arguments, nothing re-derived later.

Every option of the spec is spelled out, and so is the SQL the operation runs (``sql=``): the
statements ``fencekit.sqlgen`` renders now, frozen. The migration means, and does, the same
thing after fencekit's defaults or templates change, and a reviewer reads in the file exactly
what upgrade and downgrade install.

The SQL is written one source line per SQL line, as adjacent string literals (Python joins
them): alembic re-indents every line of the rendered code, which would change the content of a
triple-quoted string (a function body, a hash in a stamp), but not of one-line literals.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

from alembic.autogenerate import renderers
from alembic.autogenerate.api import AutogenContext

from fencekit.alembic_plugin.ops import (
    AlterFenceOp,
    CreateFenceOp,
    DropFenceOp,
    FenceOp,
    InstallCoreOp,
    RenameFenceOp,
    UninstallCoreOp,
    UpgradeCoreOp,
    spec_options,
)
from fencekit.sqlgen.move import is_move
from fencekit.sqlgen.text import comment

__all__ = ["render_sql"]

# The migration needs the operations registered before `op.create_fence` is looked up.
_IMPORT = "import fencekit.alembic_plugin  # noqa: F401  (registers op.*_fence)"
_INDENT = "    "


def _literal(text: str) -> str:
    """A Python literal of ``text``, in double quotes unless ``text`` holds one: SQL is full of
    single quotes, so lines then read as they would in psql."""
    literal = repr(text)
    if '"' in text:
        return literal
    # repr used single quotes and, with no double quote in the text, escaped none.
    return f'"{literal[1:-1]}"'


def render_sql(statements: Sequence[str], indent: str = _INDENT) -> str:
    """``statements`` as a Python tuple expression, one literal per SQL line.

    Each statement is a run of adjacent literals ending with a comma, statements are separated
    by a blank line; ``eval`` of the result gives back exactly ``statements``.
    """
    if not statements:
        return "()"
    inner = indent + _INDENT
    blocks = []
    for statement in statements:
        lines = statement.split("\n")
        literals = [_literal(line + "\n") for line in lines[:-1]] + [_literal(lines[-1])]
        if len(literals) > 1 and literals[-1] == '""':
            literals.pop()  # a statement ending with a newline: its last literal holds it
        literals[-1] += ","
        blocks.append("".join(f"{inner}{lit}\n" for lit in literals))
    return "(\n" + "\n".join(blocks) + indent + ")"


def _call(
    autogen_context: AutogenContext,
    name: str,
    args: list[str],
    kwargs: dict[str, Any],
    sql: Sequence[str] | None = None,
    note: str | None = None,
) -> str:
    autogen_context.imports.add(_IMPORT)
    prefix = autogen_context.opts.get("alembic_module_prefix", "op.")
    parts = [*args, *(f"{k}={v!r}" for k, v in kwargs.items())]
    if sql is not None:
        parts.append(f"sql={render_sql(sql)}")
    head = "".join(f"# {line}\n" for line in textwrap.wrap(comment(note or ""), 92))
    if not parts:
        return f"{head}{prefix}{name}()"
    body = "".join(f"{_INDENT}{p},\n" for p in parts)
    return f"{head}{prefix}{name}(\n{body})"


@renderers.dispatch_for(CreateFenceOp)
@renderers.dispatch_for(DropFenceOp)
@renderers.dispatch_for(AlterFenceOp)
def _render_fence(autogen_context: AutogenContext, op: FenceOp) -> str:
    # An operation made without SQL (by hand, or by a tool of the user's) is frozen here:
    # writing the migration file is the moment its SQL is fixed.
    old, new, table = op.old, op.new, op.change.table
    kwargs: dict[str, Any] = {"schema": table.schema}
    note = op.note
    if old is not None and new is not None:
        kwargs.update(old=spec_options(old), new=spec_options(new))
        if note is None and is_move(old, new):
            note = (
                f"{table}: {old.scope} fence -> {new.scope} fence in one transaction, "
                "fences carried over (never unprotected in between)"
            )
    else:
        kwargs.update(spec_options(op.spec))
    return _call(autogen_context, op.name, [repr(table.name)], kwargs, op.statements(), note)


@renderers.dispatch_for(InstallCoreOp)
def _render_install(autogen_context: AutogenContext, op: InstallCoreOp) -> str:
    return _call(autogen_context, "install_fencekit", [], {"core_version": op.core_version})


@renderers.dispatch_for(UninstallCoreOp)
def _render_uninstall(autogen_context: AutogenContext, op: UninstallCoreOp) -> str:
    return _call(autogen_context, "uninstall_fencekit", [], {"core_version": op.core_version})


@renderers.dispatch_for(UpgradeCoreOp)
def _render_upgrade(autogen_context: AutogenContext, op: UpgradeCoreOp) -> str:
    kwargs = {"from_version": op.from_version, "to_version": op.to_version}
    return _call(autogen_context, "upgrade_fencekit", [], kwargs)


@renderers.dispatch_for(RenameFenceOp)
def _render_rename(autogen_context: AutogenContext, op: RenameFenceOp) -> str:
    args = [repr(op.spec.table.name), repr(op.new_table.name)]
    kwargs = {"schema": op.spec.table.schema, **spec_options(op.spec)}
    note = (
        f"{op.spec.table} was renamed to {op.new_table}: its fence follows it (registry, "
        "triggers, counters, fences)"
    )
    return _call(autogen_context, "rename_fence", args, kwargs, op.statements(), note)
