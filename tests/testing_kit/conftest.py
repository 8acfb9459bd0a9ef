"""The testing kit's own tests: its fixtures on the suite's servers, and the billing example.

The kit's plugin is loaded in this run through its entry point, like in any project that
installs pytest-fencekit. ``fencekit_server`` is overridden here to be the suite's main server (the
embedded one, or FENCEKIT_TEST_DSN), so that the kit does not start a second one.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from fencekit.embedded import EmbeddedServer
from fencekit.testing.servers import Server, from_dsn

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "billing"
DJANGO_EXAMPLE = EXAMPLE.with_name("billing_django")
pytest_plugins = ["pytester"]


@pytest.fixture(scope="session")
def fencekit_server(pg_server: EmbeddedServer) -> Server:
    if os.environ.get("FENCEKIT_TEST_DSN"):
        return from_dsn(os.environ["FENCEKIT_TEST_DSN"])
    return Server("embedded", pg_server.host, pg_server.port, pg_server.user, pg_server.password)


@pytest.fixture
def example(pytester: pytest.Pytester, fencekit_server: Server) -> pytest.Pytester:
    """A copy of the billing example as pytester's project, using this run's server."""
    # Not a Django project: a settings module set by tests/django must not reach its workers.
    pytester._monkeypatch.delenv("DJANGO_SETTINGS_MODULE", raising=False)  # type: ignore[attr-defined]
    return _copy(EXAMPLE, pytester, fencekit_server)


@pytest.fixture
def django_example(pytester: pytest.Pytester, fencekit_server: Server) -> pytest.Pytester:
    """A copy of the Django billing example as pytester's project, using this run's server."""
    # Its pytest.ini names the settings module; the one tests/django sets would win over it.
    pytester._monkeypatch.delenv("DJANGO_SETTINGS_MODULE", raising=False)  # type: ignore[attr-defined]
    return _copy(DJANGO_EXAMPLE, pytester, fencekit_server)


def _copy(source: Path, pytester: pytest.Pytester, fencekit_server: Server) -> pytest.Pytester:
    for item in source.iterdir():
        if item.name in ("__pycache__", ".pytest_cache"):
            continue
        dest = pytester.path / item.name
        if item.is_dir():
            shutil.copytree(item, dest, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(item, dest)
    # The subprocess uses this run's server as a DSN server (the kit's `dsn` kind).
    pytester._monkeypatch.setenv(  # type: ignore[attr-defined]
        "FENCEKIT_TEST_DSN", fencekit_server.dsn_for(fencekit_server.maintenance_dbname)
    )
    return pytester
