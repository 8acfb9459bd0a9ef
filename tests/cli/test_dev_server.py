"""``fencekit dev-server`` as a user runs it: a real process, a real server, stopped again."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)

pytest.importorskip("pgserver")

FENCEKIT = [sys.executable, "-m", "fencekit.cli"]


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A directory directly under the temp dir: as root, pgserver makes every parent of a data
    directory traversable by its system user, and pytest's own tmp_path parents are 0700."""
    path = Path(tempfile.mkdtemp(prefix="fencekit-dev-server-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _postmaster_pid(datadir: Path) -> int:
    return int((datadir / "postmaster.pid").read_text().split()[0])


def _gone(pid: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_detach_prints_a_dsn_alone_and_stop_delete_removes_the_server(tmp_path: Path) -> None:
    datadir = tmp_path / "pg"
    started = subprocess.run(
        [*FENCEKIT, "dev-server", "--data-dir", str(datadir), "--dbname", "billing", "--detach"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    dsn = started.stdout.strip()
    assert "\n" not in dsn  # stdout is the DSN alone: `export FENCEKIT_DSN=$(...)` works
    assert "fencekit dev-server --stop" in started.stderr
    pid = _postmaster_pid(datadir)
    try:
        with psycopg.connect(dsn) as conn:
            conn.execute("CREATE TABLE kept (x int)")
            assert conn.execute("SELECT current_database()").fetchone() == ("billing",)
        # A second start finds the running server and the same database.
        again = subprocess.run(
            [*FENCEKIT, "dev-server", "--data-dir", str(datadir), "--dbname", "billing",
             "--detach"],
            capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        assert again.stdout.strip() == dsn
        assert _postmaster_pid(datadir) == pid
    finally:
        stopped = subprocess.run(
            [*FENCEKIT, "dev-server", "--data-dir", str(datadir), "--stop", "--delete"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert stopped.returncode == 0, stopped.stderr
    assert _gone(pid)
    assert not datadir.exists()


def test_foreground_serves_tcp_until_ctrl_c_and_keeps_the_data(tmp_path: Path) -> None:
    datadir = tmp_path / "pg"
    with socket_port() as port:
        pass
    proc = subprocess.Popen(
        [*FENCEKIT, "dev-server", "--data-dir", str(datadir), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        dsn = proc.stdout.readline().strip()
        assert dsn == f"postgresql://postgres@127.0.0.1:{port}/postgres"
        with psycopg.connect(dsn) as conn:
            conn.execute("CREATE TABLE kept (x int)")
            assert conn.execute("SELECT inet_server_port()").fetchone() == (port,)
        pid = _postmaster_pid(datadir)
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "stopped; data kept in" in err
    assert _gone(pid)
    # The next start has the table again.
    out = subprocess.run(
        [*FENCEKIT, "dev-server", "--data-dir", str(datadir), "--detach"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    try:
        with psycopg.connect(out.stdout.strip()) as conn:
            assert conn.execute("SELECT to_regclass('kept') IS NOT NULL").fetchone() == (True,)
    finally:
        subprocess.run(
            [*FENCEKIT, "dev-server", "--data-dir", str(datadir), "--stop", "--delete"],
            timeout=120, check=True, capture_output=True,
        )  # fmt: skip


def test_stop_with_nothing_running_says_so(tmp_path: Path) -> None:
    done = subprocess.run(
        [*FENCEKIT, "dev-server", "--data-dir", str(tmp_path / "none"), "--stop"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0
    assert "no server was running in" in done.stderr


class socket_port:
    """A free TCP port on 127.0.0.1 (bound, then released)."""

    def __enter__(self) -> int:
        import socket

        self._s = socket.socket()
        self._s.bind(("127.0.0.1", 0))
        return int(self._s.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self._s.close()


def test_a_signal_while_starting_leaves_no_server_running(tmp_path: Path) -> None:
    datadir = tmp_path / "pg"
    proc = subprocess.Popen(
        [*FENCEKIT, "dev-server", "--data-dir", str(datadir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.0)  # the command is up, the server (probably) still starting
    proc.send_signal(signal.SIGTERM)
    try:
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    pid_file = datadir / "postmaster.pid"
    assert not pid_file.exists() or _gone(_postmaster_pid(datadir), timeout=5)
