"""The kit ships in the wheel and works from it, away from any checkout: the plugin's entry
point, the ``testing`` extra, and a user's project run against the installed files only."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fencekit.testing.servers import Server
from tests.testing_kit.test_servers import _project

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.multiproc


def test_the_wheel_carries_the_kit_and_runs_it(tmp_path: Path, fencekit_server: Server) -> None:
    pytest.importorskip("hatchling", reason="hatchling builds the wheel (pip install hatchling)")
    src = tmp_path / "src"
    shutil.copytree(
        ROOT, src, ignore=shutil.ignore_patterns(".venv", ".git", "*.pyc", "__pycache__", "dist")
    )
    subprocess.run(  # noqa: S603
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path / "dist"), str(src)],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    archive = zipfile.ZipFile(wheel)
    names = archive.namelist()
    for module in ("__init__", "plugin", "channel", "workers", "scenario", "many", "history"):
        assert f"fencekit/testing/{module}.py" in names
    dist = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
    entry_points = archive.read(f"{dist}/entry_points.txt").decode()
    assert "[pytest11]\nfencekit = fencekit.testing.plugin" in entry_points
    metadata = archive.read(f"{dist}/METADATA").decode()
    assert "Provides-Extra: testing" in metadata
    assert any(
        line.startswith("Requires-Dist: pytest-postgresql") and "extra == 'testing'" in line
        for line in metadata.splitlines()
    )

    # A user's project, run with the unpacked wheel first on the path (the dependencies come
    # from this environment), from a directory outside the checkout.
    installed = tmp_path / "installed"
    archive.extractall(installed)
    project = _project()
    try:
        env = {
            **os.environ,
            "PYTHONPATH": str(installed),
            "FENCEKIT_TEST_DSN": fencekit_server.dsn_for(fencekit_server.maintenance_dbname),
        }
        code = "import fencekit.testing.plugin as p; print(p.__file__)"
        where = subprocess.run(  # noqa: S603
            [sys.executable, "-c", code], cwd=project, env=env, capture_output=True, text=True,
            check=True,
        ).stdout.strip()  # fmt: skip
        assert where.startswith(str(installed)), where
        run = subprocess.run(  # noqa: S603
            [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly"],
            cwd=project, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
        assert "4 passed" in run.stdout
    finally:
        shutil.rmtree(project, ignore_errors=True)
