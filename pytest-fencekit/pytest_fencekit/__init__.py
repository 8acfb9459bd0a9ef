"""pytest-fencekit: the pytest plugin of fencekit's testing kit (docs/testing-your-workers.md).

pytest loads :mod:`pytest_fencekit.plugin` through its ``pytest11`` entry point (``fencekit``;
``-p no:fencekit`` turns it off): the ``fenced_db`` and ``fencekit_server`` fixtures and the
``fencekit_*`` ini options. :func:`fenced_database` makes other fixtures. The kit's functions
(``takeover``, ``run_many``, the assertions) are in :mod:`fencekit.testing`.
"""

from __future__ import annotations

from pytest_fencekit.plugin import fenced_database

__all__ = ["fenced_database"]
