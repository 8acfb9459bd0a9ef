"""Write fence operations into migration files: explicit arguments, nothing re-derived later.

Every option of the spec and the template version are spelled out, so the migration means the
same thing after fencekit's defaults or templates change.
"""

from __future__ import annotations

from typing import Any

from alembic.autogenerate import renderers
from alembic.autogenerate.api import AutogenContext

from fencekit.alembic_plugin.ops import (
    AlterFenceOp,
    CreateFenceOp,
    DropFenceOp,
    InstallCoreOp,
    UninstallCoreOp,
    UpgradeCoreOp,
    spec_options,
)
from fencekit.spec import FenceSpec

__all__: list[str] = []

# The migration needs the operations registered before `op.create_fence` is looked up.
_IMPORT = "import fencekit.alembic_plugin  # noqa: F401  (registers op.*_fence)"


def _call(
    autogen_context: AutogenContext, name: str, args: list[str], kwargs: dict[str, Any]
) -> str:
    autogen_context.imports.add(_IMPORT)
    prefix = autogen_context.opts.get("alembic_module_prefix", "op.")
    parts = [*args, *(f"{k}={v!r}" for k, v in kwargs.items())]
    if not parts:
        return f"{prefix}{name}()"
    body = "".join(f"    {p},\n" for p in parts)
    return f"{prefix}{name}(\n{body})"


def _fence_kwargs(spec: FenceSpec) -> tuple[list[str], dict[str, Any]]:
    return [repr(spec.table.name)], {"schema": spec.table.schema, **spec_options(spec)}


@renderers.dispatch_for(CreateFenceOp)
def _render_create(autogen_context: AutogenContext, op: CreateFenceOp) -> str:
    args, kwargs = _fence_kwargs(op.spec)
    kwargs["template_version"] = op.template_version
    return _call(autogen_context, "create_fence", args, kwargs)


@renderers.dispatch_for(DropFenceOp)
def _render_drop(autogen_context: AutogenContext, op: DropFenceOp) -> str:
    args, kwargs = _fence_kwargs(op.spec)
    kwargs["template_version"] = op.template_version
    return _call(autogen_context, "drop_fence", args, kwargs)


@renderers.dispatch_for(AlterFenceOp)
def _render_alter(autogen_context: AutogenContext, op: AlterFenceOp) -> str:
    kwargs: dict[str, Any] = {
        "schema": op.new.table.schema,
        "old": spec_options(op.old),
        "old_template_version": op.old_template_version,
        "new": spec_options(op.new),
        "template_version": op.template_version,
    }
    return _call(autogen_context, "alter_fence", [repr(op.new.table.name)], kwargs)


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
