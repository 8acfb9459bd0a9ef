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
    MoveFenceOp,
    RenameFenceOp,
    UninstallCoreOp,
    UpgradeCoreOp,
    spec_options,
)
from fencekit.spec import FenceSpec
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


def _fence_kwargs(spec: FenceSpec) -> tuple[list[str], dict[str, Any]]:
    return [repr(spec.table.name)], {"schema": spec.table.schema, **spec_options(spec)}


def _fence_call(autogen_context: AutogenContext, name: str, op: FenceOp) -> str:
    # An operation made without SQL (by hand, or by a tool of the user's) is frozen here:
    # writing the migration file is the moment its SQL is fixed.
    args, kwargs = _fence_kwargs(op.spec)
    return _call(autogen_context, name, args, kwargs, op.statements())


@renderers.dispatch_for(CreateFenceOp)
def _render_create(autogen_context: AutogenContext, op: CreateFenceOp) -> str:
    return _fence_call(autogen_context, "create_fence", op)


@renderers.dispatch_for(DropFenceOp)
def _render_drop(autogen_context: AutogenContext, op: DropFenceOp) -> str:
    return _fence_call(autogen_context, "drop_fence", op)


@renderers.dispatch_for(AlterFenceOp)
def _render_alter(autogen_context: AutogenContext, op: AlterFenceOp) -> str:
    kwargs: dict[str, Any] = {
        "schema": op.new.table.schema,
        "old": spec_options(op.old),
        "new": spec_options(op.new),
    }
    args = [repr(op.new.table.name)]
    return _call(autogen_context, "alter_fence", args, kwargs, op.statements(), op.note)


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


@renderers.dispatch_for(MoveFenceOp)
def _render_move(autogen_context: AutogenContext, op: MoveFenceOp) -> str:
    kwargs: dict[str, Any] = {
        "schema": op.new.table.schema,
        "old": spec_options(op.old),
        "new": spec_options(op.new),
    }
    note = (
        f"{op.new.table}: {op.old.scope} fence -> {op.new.scope} fence in one transaction, "
        "fences carried over (never unprotected in between)"
    )
    return _call(
        autogen_context, "move_fence", [repr(op.new.table.name)], kwargs, op.statements(), note
    )
