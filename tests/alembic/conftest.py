"""Fixtures for alembic round trips: a temporary alembic project on a fresh test database.

The project is made by ``fencekit alembic init`` (the shipped template), its models live in a
``models.py`` written by each test, and every alembic command runs as a real ``alembic``
subprocess, so the entry point, env.py and the rendered migration files are exercised as users
run them.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy.engine import URL

from fencekit.cli.alembic import run_init
from tests import pg_binaries

PGSERVER_BIN = Path(__import__("pgserver").__file__).parent / "pginstall" / "bin"


def sqlalchemy_url(dsn: str) -> str:
    """A psycopg conninfo -> a SQLAlchemy URL (unix sockets go in the query string)."""
    p = conninfo_to_dict(dsn)
    query = {"host": str(p["host"]), "port": str(p.get("port") or 5432)}
    url = URL.create(
        "postgresql+psycopg",
        username=p.get("user"),
        password=p.get("password"),
        database=p["dbname"],
        query=query,
    )
    return url.render_as_string(hide_password=False)


def client_bin(name: str, server_version_num: int) -> str:
    """pg_dump / psql of the server's own major version (pg_dump refuses newer servers)."""
    major = server_version_num // 10000
    release = pg_binaries.cached_bindir(major) if major in pg_binaries.RELEASES else None
    candidates = [PGSERVER_BIN / name, Path(f"/usr/lib/postgresql/{major}/bin/{name}")]
    if release is not None:  # the version matrix's servers (tests/pg_binaries.py)
        candidates.append(release / name)
    for candidate in candidates:
        if candidate.exists():
            out = subprocess.run(
                [str(candidate), "--version"], capture_output=True, text=True, check=True
            ).stdout
            if re.search(rf"\b{major}\.\d+", out):
                return str(candidate)
    pytest.skip(f"no {name} for PostgreSQL {major} on this machine")
    raise AssertionError  # unreachable


@dataclass
class Project:
    """A temporary alembic project bound to one test database."""

    root: Path
    dsn: str
    url: str
    server_version_num: int
    revisions: list[str] = field(default_factory=list)

    @property
    def versions(self) -> Path:
        return self.root / "migrations" / "versions"

    def write_models(self, source: str) -> None:
        (self.root / "models.py").write_text(textwrap.dedent(source))
        shutil.rmtree(self.root / "__pycache__", ignore_errors=True)

    def alembic(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "DATABASE_URL": self.url, "PYTHONDONTWRITEBYTECODE": "1"}
        proc = subprocess.run(
            [sys.executable, "-m", "alembic", *args],
            cwd=self.root,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"alembic {' '.join(args)} failed ({proc.returncode}):\n"
                f"{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def autogenerate(self, message: str) -> Path:
        """``alembic revision --autogenerate`` -> the new migration file."""
        before = set(self.versions.glob("*.py"))
        self.alembic("revision", "--autogenerate", "-m", message)
        (new,) = set(self.versions.glob("*.py")) - before
        return new

    def set_option(self, key: str, value: str) -> None:
        ini = self.root / "alembic.ini"
        text = re.sub(rf"^{re.escape(key)} =.*$", f"{key} = {value}", ini.read_text(), flags=re.M)
        ini.write_text(text)

    def connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsn, autocommit=True)

    def pg_dump_schema(self) -> str:
        """``pg_dump -s`` without the version line and the alembic bookkeeping table."""
        pg_dump = client_bin("pg_dump", self.server_version_num)
        out = subprocess.run(
            [pg_dump, "-s", "--no-owner", "--no-privileges", "-T", "alembic_version", self.dsn],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        lines = [
            line
            for line in out.splitlines()
            if not line.startswith("-- Dumped")
            and not line.startswith("\\restrict")
            and not line.startswith("\\unrestrict")
        ]
        return "\n".join(lines)

    def psql_file(self, path: Path) -> None:
        psql = client_bin("psql", self.server_version_num)
        subprocess.run(
            [psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(path), self.dsn],
            capture_output=True,
            text=True,
            check=True,
        )


def make_project(root: Path, dsn: str) -> Project:
    args = argparse.Namespace(
        directory=str(root / "migrations"),
        config=str(root / "alembic.ini"),
        metadata="models:metadata",
        url=None,
    )
    cwd = os.getcwd()
    os.chdir(root)  # alembic.ini records script_location relative to the ini file
    try:
        assert run_init(args) == 0
    finally:
        os.chdir(cwd)
    with psycopg.connect(dsn) as conn:
        version = conn.info.server_version
        if version < 150000:
            # 15's default on 14 too: env.py refuses a path through a schema anyone may CREATE in
            conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    return Project(root=root, dsn=dsn, url=sqlalchemy_url(dsn), server_version_num=version)


@pytest.fixture
def project(tmp_path: Path, dsn: str) -> Project:
    """An alembic project on a fresh database that has fencekit's core installed."""
    return make_project(tmp_path, dsn)


@pytest.fixture
def raw_project(tmp_path: Path, raw_dsn: str) -> Project:
    """An alembic project on a fresh database without fencekit's core."""
    return make_project(tmp_path, raw_dsn)
