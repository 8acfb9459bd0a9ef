"""Test your own workers: the pytest plugin that pauses a real worker past its lease and proves
the stale write is rejected (docs/testing-your-workers.md).

    pip install 'pg-fencekit[testing]'    # or: pip install pytest-fencekit

The pytest plugin (the ``fenced_db`` fixture, the ``fencekit_*`` ini options and the
``fenced_database`` factory) ships as its own distribution, pytest-fencekit (package
``pytest_fencekit``); this package is the kit it and your tests call.

In the worker (production code; a no-op outside the kit's tests)::

    from fencekit.testing import checkpoint
    checkpoint("computing")

In the tests (pytest-fencekit's plugin loads itself through its ``pytest11`` entry point)::

    from fencekit.testing import takeover

    def test_stale_rebuild_is_rejected(fenced_db):
        takeover(rebuild_summary, fenced_db.app_dsn, 42, resource="billing:42",
                 table="billing_summary")

Only :func:`checkpoint` is imported eagerly: a worker importing it loads nothing else of the
kit (and never pytest).
"""

from __future__ import annotations

import importlib
from typing import Any

from fencekit.testing.channel import checkpoint

__all__ = [
    "DatabaseSetup",
    "FencedDatabase",
    "FencingAssertionError",
    "ManyResult",
    "Outcome",
    "TakeoverResult",
    "Worker",
    "WorkerError",
    "assert_fence",
    "assert_no_rejections",
    "assert_rejections",
    "atakeover",
    "checkpoint",
    "describe",
    "paused",
    "run_many",
    "spawn",
    "spawn_command",
    "takeover",
    "wait_lease_expired",
]

_LAZY = {
    "DatabaseSetup": "database",
    "FencedDatabase": "database",
    "FencingAssertionError": "fencekit.errors",
    "ManyResult": "many",
    "Outcome": "workers",
    "TakeoverResult": "scenario",
    "Worker": "workers",
    "WorkerError": "fencekit.errors",
    "assert_fence": "assertions",
    "assert_no_rejections": "assertions",
    "assert_rejections": "assertions",
    "atakeover": "scenario",
    "describe": "assertions",
    "paused": "scenario",
    "run_many": "many",
    "spawn": "workers",
    "spawn_command": "workers",
    "takeover": "scenario",
    "wait_lease_expired": "clocks",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fencekit.testing' has no attribute {name!r}")
    path = module if "." in module else f"fencekit.testing.{module}"
    value = getattr(importlib.import_module(path), name)
    globals()[name] = value
    return value
