"""``fencekit alembic init --metadata --url`` does not ask to set what it set."""

from __future__ import annotations

import os
from pathlib import Path

from .conftest import Cli


def _init(cli: Cli, tmp_path: Path, *options: str) -> str:
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        r = cli("alembic", "init", "migrations", *options)
    finally:
        os.chdir(cwd)
    assert r.code == 0, r.err
    return r.out


def test_init_with_metadata_and_url_asks_for_nothing_it_set(cli: Cli, tmp_path: Path) -> None:
    out = _init(
        cli, tmp_path, "--metadata", "models:metadata", "--url", "postgresql+psycopg:///app"
    )
    assert "Please edit" not in out
    assert "set target_metadata" not in out
    assert "sqlalchemy.url in" not in out
    assert "Next: declare fences on your tables" in out
    ini = (tmp_path / "alembic.ini").read_text()
    assert "sqlalchemy.url = postgresql+psycopg:///app" in ini


def test_init_without_url_asks_for_it(cli: Cli, tmp_path: Path) -> None:
    out = _init(cli, tmp_path, "--metadata", "models:metadata")
    assert "Next: set sqlalchemy.url in alembic.ini" in out
