"""The ``alembic.plugins`` entry point of fencekit (alembic >= 1.18): ``setup(plugin)``.

Deliberately tiny and free of alembic imports: alembic loads its entry points in the middle of
its own package import, when most of alembic cannot be imported yet. The operations, renderers
and comparator live in :mod:`fencekit.alembic_plugin`, imported when autogenerate first runs.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from alembic.runtime.plugins import Plugin

__all__ = ["setup"]


class _PluginModule(types.ModuleType):
    """This module, iterable: alembic 1.18 and 1.19 iterate whatever an entry point loads (a
    list of modules), 1.20+ take a module. Yielding itself makes one entry point work on both
    instead of breaking ``import alembic`` on 1.18/1.19."""

    def __iter__(self) -> Iterator[types.ModuleType]:
        yield self


sys.modules[__name__].__class__ = _PluginModule


def _compare(*args: Any) -> Any:
    # Returns None: alembic >= 1.18 reads anything but STOP as "continue with the others".
    from fencekit.alembic_plugin.compare import compare_fences
    from fencekit.alembic_plugin.grants import compare_grants, log_detected

    compare_fences(*args)
    compare_grants(*args)
    log_detected(args[1])
    return None


def setup(plugin: Plugin) -> None:
    """Register fencekit's autogenerate comparator with an alembic ``Plugin``."""
    from alembic.util import DispatchPriority  # alembic.util is loaded before entry points

    # LAST: after alembic's table comparison, so create_fence follows create_table.
    plugin.add_autogenerate_comparator(_compare, "schema", priority=DispatchPriority.LAST)
