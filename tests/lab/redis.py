"""redis-server on loopback, no persistence: the Celery and dramatiq broker of tests/tasks."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from tests.lab.ports import LOOPBACK, free_port


class RedisUnavailable(RuntimeError):
    """Debian's redis-server is not installed (scripts/_system.sh installs it)."""


@contextlib.contextmanager
def redis_server(workdir: Path, timeout: float = 10.0) -> Iterator[str]:
    """Start redis-server in ``workdir``; yield its URL; stop it."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RedisUnavailable("redis-server is missing: apt-get install redis-server")
    port = free_port()
    argv = [binary, "--port", str(port), "--bind", LOOPBACK, "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(  # noqa: S603  # fixed argv
        [*argv, "--dir", str(workdir), "--protected-mode", "yes"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, port), 0.2):
                break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"redis-server did not start on port {port}")
            time.sleep(0.05)
        yield f"redis://{LOOPBACK}:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)
