"""Sync forms generated from their asyncio source (scripts/async_to_sync.py) do not drift:
the lease issuer's and the psycopg 3 adapter's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: (async source, generated sync form, a line of the generated form, a hand edit of it)
PAIRS = [
    (
        "fencekit/leases/_postgres_async.py",
        "fencekit/leases/_postgres_sync.py",
        'name = "postgres"',
        'name = "other"',
    ),
    (
        "fencekit/_psycopg_async.py",
        "fencekit/_psycopg_sync.py",
        "_internals.begin(conn, _begin_query(conn, value))",
        "pass",
    ),
]


def test_every_generated_sync_form_is_what_its_async_source_gives() -> None:
    run = subprocess.run(
        [sys.executable, "scripts/async_to_sync.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize(("source", "generated", "line", "edit"), PAIRS)
def test_the_check_fails_on_a_hand_edit(
    tmp_path: Path, source: str, generated: str, line: str, edit: str
) -> None:
    """The check is not vacuous: an edit of a generated file alone is caught (on a copy)."""
    for name in ["pyproject.toml", *(name for pair in PAIRS for name in pair[:2])]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text((ROOT / name).read_text())
    path = tmp_path / generated
    assert line in path.read_text()
    path.write_text(path.read_text().replace(line, edit, 1))
    run = subprocess.run(
        [sys.executable, "scripts/async_to_sync.py", "--check", "--root", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 1
    name = Path(generated).name
    assert f"{name} is not what scripts/async_to_sync.py generates" in run.stderr
    assert run.stderr.count("is not what") == 1  # the other pair, untouched, passes
