"""`import fencekit` loads no optional dependency: not pglast (only fencekit.ddl parses SQL),
not an extra's package, not pytest (the plugin is pytest-fencekit's)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

OPTIONAL = (
    "pglast", "pytest", "pytest_fencekit", "pytest_postgresql", "sqlalchemy", "alembic",
    "psycopg_pool", "psycopg2", "asyncpg", "etcd3gw", "kazoo", "prometheus_client",
    "opentelemetry", "pgserver", "plotly", "django",
)  # fmt: skip


def _loaded(statement: str) -> set[str]:
    code = f"import sys, json\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(  # noqa: S603
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    return {name.split(".")[0] for name in json.loads(out)}


@pytest.mark.parametrize(
    "statement",
    [
        "import fencekit",
        "import fencekit.psycopg",
        "import fencekit.sqlgen; fencekit.sqlgen.render_install()",
        "from fencekit.testing import checkpoint",
    ],
)
def test_importing_fencekit_loads_no_optional_dependency(statement: str) -> None:
    assert _loaded(statement) & set(OPTIONAL) == set()


def test_the_ddl_reader_is_where_pglast_loads() -> None:
    pytest.importorskip("pglast")
    assert "pglast" in _loaded("import fencekit.ddl")
