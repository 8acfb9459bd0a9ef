"""The lab's faked clocks leave nothing behind in /dev/shm, however their processes end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.lab import IN_CI
from tests.lab.clocks import FakeClock, find_libfaketime

pytestmark = pytest.mark.system


def _leftovers(pid: int) -> list[str]:
    """The pair libfaketime makes for a process that was handed none, by its pid."""
    names = (f"faketime_shm_{pid}", f"faketime_sem_{pid}")
    return [f for f in os.listdir("/dev/shm") if f.endswith(names)]


def test_a_killed_process_and_a_closed_clock_leave_no_shared_memory() -> None:
    library = find_libfaketime()
    if library is None:
        if IN_CI:
            pytest.fail("libfaketime is missing (apt-get install faketime)")
        pytest.skip("libfaketime is missing (apt-get install faketime)")
    clock = FakeClock("workers", library)
    try:
        clock.set("+100")
        # The child reports its faked time, then waits to be killed (no exit handler runs).
        child = subprocess.Popen(
            [sys.executable, "-c", "import sys, time; print(time.time(), flush=True); "
             "sys.stdin.read()"],
            env={**os.environ, **clock.env()}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        assert child.stdout is not None
        faked = float(child.stdout.readline())
        assert faked - time.time() > 90  # the clock is faked in the child
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        assert _leftovers(child.pid) == []
        assert all(f.exists() for f in clock.shared.files)
    finally:
        clock.close()
    assert not any(f.exists() for f in clock.shared.files)
