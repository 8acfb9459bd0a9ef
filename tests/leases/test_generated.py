"""Sync forms generated from their asyncio source (scripts/async_to_sync.py) do not drift."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAIR = ("fencekit/leases/_postgres_async.py", "fencekit/leases/_postgres_sync.py")


def test_every_generated_sync_form_is_what_its_async_source_gives() -> None:
    run = subprocess.run(
        [sys.executable, "scripts/async_to_sync.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr


def test_the_check_fails_on_a_hand_edit(tmp_path: Path) -> None:
    """The check is not vacuous: an edit of the generated file alone is caught (on a copy)."""
    for name in ("pyproject.toml", *PAIR):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text((ROOT / name).read_text())
    generated = tmp_path / PAIR[1]
    generated.write_text(generated.read_text().replace('name = "postgres"', 'name = "other"'))
    run = subprocess.run(
        [sys.executable, "scripts/async_to_sync.py", "--check", "--root", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 1
    assert "_postgres_sync.py is not what scripts/async_to_sync.py generates" in run.stderr
