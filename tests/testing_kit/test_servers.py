"""Each fixture of the kit on each kind of server: Debian's PostgreSQL 15 through
pytest-postgresql's ``postgresql_proc`` (as the ``postgres`` user: PostgreSQL refuses root) and
``postgresql_noproc``, a DSN server, and the embedded one.

Each run is a separate pytest (a user's run): its test file uses ``fenced_db`` (ini options),
a per-test and a per-session database from the factory, a schema from an SQL file and fences
from specs, the application role, and a stale write rejected and counted.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from fencekit.embedded import EmbeddedServer
from tests.lab.postgres import debian_bindir

pytestmark = [pytest.mark.multiproc, pytest.mark.system]
ROOT = Path(__file__).resolve().parents[2]

SCHEMA = "CREATE TABLE jobs (id int PRIMARY KEY, state text NOT NULL);\n"
INI = """[pytest]
fencekit_schema = schema.sql
fencekit_fences = fences:SPECS
pythonpath = .
addopts = -p no:cacheprovider
asyncio_default_fixture_loop_scope = function
"""
FENCES = """from fencekit.spec import FenceSpec, TableName
SPECS = [FenceSpec(TableName("public", "jobs"), scope="key", key=("id",))]
"""
TESTS = """
import psycopg
import pytest

import fencekit.psycopg as fkp
from fencekit.errors import StaleTokenError
from fencekit.testing import assert_rejections
from pytest_fencekit import fenced_database

once = fenced_database(scope="session")


def write(db, token, state):
    with psycopg.connect(db.app_dsn, autocommit=True) as conn, fkp.transaction(conn, token):
        conn.execute("INSERT INTO jobs VALUES (1, %s) ON CONFLICT (id) DO UPDATE "
                     "SET state = excluded.state", (state,))


def test_fenced_db(fenced_db, fencekit_server):
    print("SERVER", fencekit_server.kind)
    with psycopg.connect(fenced_db.app_dsn) as conn:
        assert conn.execute("SELECT pg_has_role('fencekit_writer', 'MEMBER')").fetchone()[0]
        me = "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
        assert not conn.execute(me).fetchone()[0]
    write(fenced_db, 5, "a")
    with pytest.raises(StaleTokenError):
        write(fenced_db, 4, "b")
    assert_rejections("public.jobs", stale=1, missing=0)
    assert fenced_db.fence("jobs") == 5


def test_a_fresh_database_per_test(fenced_db):
    assert_rejections("jobs", stale=0)
    assert fenced_db.snapshot("jobs") == []


@pytest.mark.parametrize("n", [1, 2])
def test_one_database_per_session(once, n):
    write(once, n, str(n))
    assert once.fence("jobs") == n
"""


def _project() -> Path:
    # Readable and writable by the postgres user too (the proc run is that user's).
    path = Path(tempfile.mkdtemp(prefix="fk-kit-servers-"))
    path.chmod(0o777)
    (path / "schema.sql").write_text(SCHEMA)
    (path / "pytest.ini").write_text(INI)
    (path / "fences.py").write_text(FENCES)
    (path / "test_kit.py").write_text(TESTS)
    for p in path.iterdir():
        p.chmod(0o666)
    return path


@pytest.fixture
def project() -> Iterator[Path]:
    path = _project()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _run(project: Path, *args: str, env: dict[str, str] | None = None,
         prefix: list[str] | None = None, python: str = sys.executable) -> str:  # fmt: skip
    environ = {k: v for k, v in os.environ.items() if k != "FENCEKIT_TEST_DSN"}
    proc = subprocess.run(  # noqa: S603 - our own pytest
        [*(prefix or []), python, "-m", "pytest", "-q", "-s", "-p", "no:randomly", *args],
        cwd=project, env={**environ, **(env or {})}, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "4 passed" in out, out[-3000:]
    return out


def _roles(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        return {r for (r,) in conn.execute("SELECT rolname FROM pg_roles")}


def test_embedded(project: Path) -> None:
    out = _run(project, "--fencekit-server=embedded")
    assert "SERVER embedded" in out


def test_dsn_server_with_roles_already_there(
    project: Path, debian15_server: EmbeddedServer
) -> None:
    dsn = debian15_server.dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS fk_kit_app")
        conn.execute("CREATE ROLE fk_kit_app LOGIN")  # someone made it before the session
    try:
        before = _roles(dsn)
        out = _run(project, "--fencekit-dsn", dsn, "-o", "fencekit_app_role=fk_kit_app")
        assert "SERVER dsn" in out
        assert _roles(dsn) == before  # the role found there is still there, nothing else left
        out = _run(project, env={"FENCEKIT_TEST_DSN": dsn})  # the environment variable too
        assert "SERVER dsn" in out
        assert _roles(dsn) == before  # the role the session created is dropped again
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DROP ROLE IF EXISTS fk_kit_app")


def test_noproc_on_debian15(project: Path, debian15_server: EmbeddedServer) -> None:
    out = _run(
        project, "--fencekit-server=noproc", "--postgresql-host", str(debian15_server.host),
        "--postgresql-port", str(debian15_server.port), "--postgresql-user", "postgres",
    )  # fmt: skip
    assert "SERVER noproc" in out


def test_proc_starts_debian15() -> None:
    """``postgresql_proc`` runs pg_ctl as the current user: as root the kit refuses with advice,
    and as the postgres user the run starts Debian's 15 itself."""
    pg_ctl = debian_bindir(15) / "pg_ctl"
    if not pg_ctl.exists():
        pytest.skip("Debian's PostgreSQL 15 is not installed (apt-get install postgresql-15)")
    project = _project()
    try:
        args = ["--fencekit-server=proc", f"--postgresql-exec={pg_ctl}"]
        if os.geteuid() == 0:
            refused = subprocess.run(  # noqa: S603
                [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", *args],
                cwd=project, capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            assert refused.returncode != 0
            assert "PostgreSQL refuses to run as root" in refused.stdout + refused.stderr
            # As the postgres user, with the system's python (the venv's may sit under /root)
            # and this checkout's packages.
            site = next(Path(sys.prefix, "lib").glob("python3*/site-packages"))
            # The editable installs' own path hooks are not read from PYTHONPATH: name both
            # checkouts (pg-fencekit and pytest-fencekit, whose entry point is in site).
            paths = [site, ROOT, ROOT / "pytest-fencekit"]
            env = {"PYTHONPATH": os.pathsep.join(map(str, paths)), "HOME": str(project)}
            prefix = ["runuser", "-u", "postgres", "--", "env",
                      *(f"{k}={v}" for k, v in env.items())]  # fmt: skip
            python = shutil.which("python3", path="/usr/bin") or "python3"
            out = _run(project, *args, f"--postgresql-unixsocketdir={project}",
                       prefix=prefix, python=python)  # fmt: skip
        else:
            out = _run(project, *args)
        assert "SERVER proc" in out
    finally:
        shutil.rmtree(project, ignore_errors=True)
