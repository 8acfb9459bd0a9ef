"""Worker processes (tests/issuers/fence_worker.py) driven from a test: start, read their JSON
events, send orders, SIGSTOP/SIGCONT, and always kill them at the end."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


class Events:
    """One queue for the events of every worker, stamped with the parent's monotonic clock."""

    def __init__(self) -> None:
        self.queue: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []

    def get(self, timeout: float) -> dict[str, Any] | None:
        try:
            ev = self.queue.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None
        self.seen.append(ev)
        return ev

    def wait_for(self, who: str, event: str, timeout: float) -> dict[str, Any]:
        """Consume events until ``who`` reports ``event``; fail on its early exit or timeout."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(
                    f"worker {who} did not report {event!r} in {timeout:g}s; "
                    f"events so far: {self.seen[-20:]}"
                )
            ev = self.get(remaining)
            if ev is None:
                continue
            if ev["who"] == who and ev["event"] == event:
                return ev
            if ev["who"] == who and ev["event"] == "exit":
                raise AssertionError(f"worker {who} exited before {event!r}: {ev}")


class Worker:
    def __init__(self, name: str, events: Events, args: list[str]) -> None:
        self.name = name
        cmd = [sys.executable, "-m", "tests.issuers.fence_worker", "--name", name, *args]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(  # noqa: S603 - fixed argv
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env,
            start_new_session=True,
        )
        self.stopped = False
        self._stderr: list[str] = []
        threading.Thread(target=self._read, args=(events,), daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read(self, events: Events) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                ev = json.loads(line)
                ev["at"] = time.monotonic()
                events.queue.put(ev)
        self.proc.wait()
        events.queue.put(
            {"who": self.name, "event": "exit", "rc": self.proc.returncode, "at": time.monotonic()}
        )

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)
            del self._stderr[:-60]

    @property
    def stderr(self) -> str:
        return "".join(self._stderr)

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)
        self.stopped = True

    def cont(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)
        self.stopped = False

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
                os.kill(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)


@contextlib.contextmanager
def workers() -> Any:
    """A list to append Workers to; every one is killed (SIGCONT + SIGKILL) at the end."""
    made: list[Worker] = []
    try:
        yield made
    finally:
        for w in made:
            w.kill()
