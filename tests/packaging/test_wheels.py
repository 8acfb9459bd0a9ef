"""Both distributions built as wheels and used from their wheels, in virtualenvs that hold
nothing of this checkout: pg-fencekit alone (no pytest plugin, no SQL parser at import) and
pytest-fencekit (the fixtures, on a user's project). Plus pytest's startup time in an empty
project with and without pg-fencekit installed, measured side by side.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fencekit.embedded import EmbeddedServer
from tests.testing_kit.test_servers import _project

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _run(*args: str | Path, cwd: Path = Path("/"), check: bool = True,
         timeout: float = 600) -> subprocess.CompletedProcess[str]:  # fmt: skip
    # Nothing of the checkout (not the current directory) or of this run's environment leaks
    # into the venv's processes.
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYTEST", "FENCEKIT"))
    }
    proc = subprocess.run(  # noqa: S603
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("hatchling", reason="hatchling builds the wheels (the dev group has it)")
    dist = tmp_path_factory.mktemp("dist")
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", dist, ROOT, ROOT / "pytest-fencekit")  # fmt: skip
    found = {w.name.split("-")[0]: w for w in dist.glob("*.whl")}
    assert set(found) == {"pg_fencekit", "pytest_fencekit"}, found
    return found


def _venv(path: Path, *requirements: str | Path) -> Path:
    """A virtualenv with only ``requirements`` (and their dependencies from the index)."""
    _run(sys.executable, "-m", "venv", "--without-pip", path)
    python = path / "bin" / "python"
    if requirements:
        # --no-compile: byte-compiling every installed module (pygments, pytest...) was half
        # of pip's CPU time here; a venv compiles what it imports, when it imports it.
        _run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-compile",
             "--disable-pip-version-check", *requirements)  # fmt: skip
    return python


@pytest.fixture(scope="module")
def venvs(
    wheels: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Path]]:
    base = tmp_path_factory.mktemp("venvs")
    lib, plugin = wheels["pg_fencekit"], wheels["pytest_fencekit"]
    # Left for pytest's own clean-up of old temporary directories (removing them here costs
    # tens of seconds under load).
    return {
        "bare": _venv(base / "bare", "pytest"),  # pytest alone, for the startup comparison
        "lib": _venv(base / "lib", lib),  # what `pip install pg-fencekit` gives
        "lib+pytest": _venv(base / "lib-pytest", lib, "pytest"),
        "plugin": _venv(base / "plugin", plugin, lib),  # `pip install pytest-fencekit`
    }


def _py(python: Path, code: str) -> str:
    return _run(python, "-c", code).stdout.strip()


def test_the_wheels_metadata(wheels: dict[str, Path]) -> None:
    lib = zipfile.ZipFile(wheels["pg_fencekit"])
    names = lib.namelist()
    dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
    meta = lib.read(f"{dist_info}/METADATA").decode().splitlines()
    requires = [line.split(":", 1)[1].strip() for line in meta if line.startswith("Requires-Dist:")]
    # A library's dependencies: plain psycopg (the application picks its implementation).
    assert [r for r in requires if "extra ==" not in r] == ["psycopg>=3.1"]
    assert "pytest-fencekit==0.1.0; extra == 'testing'" in requires
    assert not any(r.startswith(("ruff", "mypy", "hatchling")) for r in requires)
    entry_points = lib.read(f"{dist_info}/entry_points.txt").decode()
    assert "pytest11" not in entry_points
    assert "fencekit/testing/workers.py" in names
    assert "fencekit/testing/plugin.py" not in names
    shipped = lib.read("fencekit/_sql/fencekit-install.sql").decode()
    assert shipped == (ROOT / "sql" / "fencekit-install.sql").read_text(encoding="utf-8")

    plugin = zipfile.ZipFile(wheels["pytest_fencekit"])
    dist_info = next(n.split("/")[0] for n in plugin.namelist() if n.endswith("/METADATA"))
    assert (
        "[pytest11]\nfencekit = pytest_fencekit.plugin"
        in plugin.read(f"{dist_info}/entry_points.txt").decode()
    )
    meta = plugin.read(f"{dist_info}/METADATA").decode()
    assert "Requires-Dist: pg-fencekit==0.1.0" in meta
    assert "pytest_fencekit/plugin.py" in plugin.namelist()


def test_pg_fencekit_alone_loads_no_plugin_and_no_parser(venvs: dict[str, Path]) -> None:
    python = venvs["lib"]
    pip = (sys.executable, "-m", "pip", "--python", python)
    installed = json.loads(_run(*pip, "list", "--format=json").stdout)
    names = {p["name"].lower() for p in installed}
    assert {"pg-fencekit", "psycopg"} <= names
    assert not names & {"pglast", "pytest", "pytest-fencekit", "psycopg-binary"}, names
    code = (
        "import sys, importlib.metadata as md, fencekit, fencekit.psycopg, fencekit.sqlgen\n"
        "fencekit.sqlgen.render_install()\n"
        "print(sorted(e.value for e in md.entry_points(group='pytest11')))\n"
        "print(sorted(m for m in sys.modules if m.startswith(('pglast', 'pytest'))))\n"
        "print(fencekit.__file__)"
    )
    plugins, parsers, where = _py(python, code).splitlines()
    assert plugins == "[]"
    assert parsers == "[]"
    assert where.startswith(str(python.parent.parent)), where
    # The command works from the wheel; the option that parses SQL names the extra it needs.
    fencekit = python.parent / "fencekit"
    assert "CREATE SCHEMA" in _run(fencekit, "sql", "install").stdout
    (python.parent.parent / "schema.sql").write_text("CREATE TABLE t (id int PRIMARY KEY);\n")
    parse = _run(fencekit, "sql", "protect", "t", "--key", "id", "--from-ddl",
                 python.parent.parent / "schema.sql", check=False)  # fmt: skip
    assert parse.returncode == 2, parse.stderr
    assert "pip install 'pg-fencekit[ddl]'" in parse.stderr
    # With pytest beside it, a pytest run loads no fencekit plugin.
    listed = _py(venvs["lib+pytest"], "import pytest; print(pytest.__version__)")
    assert listed
    helped = _run(venvs["lib+pytest"], "-m", "pytest", "--help", cwd=python.parent.parent).stdout
    assert "fencekit" not in helped


def test_pytest_fencekit_gives_the_fixtures(
    venvs: dict[str, Path], pg_server: EmbeddedServer
) -> None:
    python = venvs["plugin"]
    where = _py(python, "import pytest_fencekit, fencekit; print(pytest_fencekit.__file__)")
    assert where.startswith(str(python.parent.parent)), where
    project = _project()
    try:
        dsn = os.environ.get("FENCEKIT_TEST_DSN") or pg_server.dsn_for("postgres")
        run = _run(python, "-m", "pytest", "-q", "--fencekit-server", "dsn", "--fencekit-dsn",
                   dsn, cwd=project, check=False)  # fmt: skip
        assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
        assert "4 passed" in run.stdout
    finally:
        shutil.rmtree(project, ignore_errors=True)


@pytest.mark.bench
def test_pytest_startup_with_and_without_pg_fencekit(
    venvs: dict[str, Path], tmp_path: Path
) -> None:
    """Interleaved runs of `pytest --co` in an empty project; prints medians and the ratio."""
    (tmp_path / "test_empty.py").write_text("def test_nothing():\n    pass\n")
    runs: dict[str, list[float]] = {"pytest alone": [], "with pg-fencekit": [],
                                    "with pytest-fencekit": []}  # fmt: skip
    pythons = {"pytest alone": venvs["bare"], "with pg-fencekit": venvs["lib+pytest"],
               "with pytest-fencekit": venvs["plugin"]}  # fmt: skip
    for _ in range(3):  # interleaved rounds; the median is printed, nothing is timed-asserted
        for label, python in pythons.items():
            start = time.perf_counter()
            _run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", cwd=tmp_path)
            runs[label].append(time.perf_counter() - start)
    base = statistics.median(runs["pytest alone"])
    print()
    for label, times in runs.items():
        median = statistics.median(times)
        spread = f"min {min(times):.3f}, max {max(times):.3f}"
        print(f"  pytest startup, {label}: median {median:.3f} s ({spread}), x{median / base:.2f}")
