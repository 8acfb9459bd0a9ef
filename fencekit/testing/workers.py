"""Workers as real processes: start, hold at a checkpoint, SIGSTOP/SIGCONT, collect the end.

A :class:`Worker` is one process running the user's code: a callable (started with the
``spawn`` method of ``multiprocessing``, so it must be importable: a module-level function) or
a command. Its stdout and stderr go to a log file (:attr:`Worker.output`). The kit listens on a
unix socket whose path it puts in the worker's environment: the worker's
:func:`~fencekit.testing.checkpoint` calls, its client metrics and, for a callable, how it
ended, arrive there.

``spawn(fn, ..., pause_at="computing")`` makes the worker wait at the first ``computing``
checkpoint until the test lets it go (:meth:`Worker.release`, or :func:`paused`, which lets go
only once the process is stopped): the pause lands exactly where the test wants it, with no
sleep in the test.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import pickle
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from fencekit.errors import WorkerError
from fencekit.testing import _bootstrap
from fencekit.testing.channel import CHANNEL_ENV, WORKER_ENV

__all__ = ["Outcome", "Worker", "spawn", "spawn_command"]

DEFAULT_TIMEOUT = 30.0


@dataclass
class Outcome:
    """How a worker ended: exit code, the callable's return value or its error (as JSON)."""

    exitcode: int | None
    ok: bool
    value: Any = None
    error: dict[str, Any] | None = None

    @property
    def rejected(self) -> str | None:
        """The fence rejection's reason (``stale``, ``missing``, ...) if it ended with one."""
        return None if self.error is None else self.error.get("reason")

    def describe(self) -> str:
        if self.ok:
            return f"exited {self.exitcode}, returned {self.value!r}"
        if self.error is None or self.error["type"] == "SystemExit":
            return f"exited {self.exitcode}"
        return f"exited {self.exitcode}, raised {self.error['type']}: {self.error['message']}"


class _Writable(Protocol):
    def write(self, data: bytes, /) -> int | None: ...


@dataclass
class _Held:
    file: _Writable
    name: str


@dataclass
class _State:
    checkpoints: list[str] = field(default_factory=list)
    metric_events: list[dict[str, Any]] = field(default_factory=list)
    totals: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    outcome: dict[str, Any] | None = None
    held: _Held | None = None


class Worker:
    """One worker process; see the module docstring."""

    def __init__(
        self,
        name: str,
        *,
        pause_at: str | None = None,
        on_exit: Callable[[Worker], None] | None = None,
    ) -> None:
        self.name = name
        self.pause_at = pause_at
        self._dir = Path(tempfile.mkdtemp(prefix=f"fk-{name[:12]}-"))
        self.log_path = self._dir / "output.log"
        self.log_path.touch()
        self._cond = threading.Condition()
        self._state = _State()
        self._stopped = False
        self._proc: Any = None
        self._on_exit = on_exit
        #: The fenced database that started it (set by ``FencedDatabase.spawn``), if any.
        self.db: Any = None
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(self._dir / "ch"))
        self._server.listen(8)
        threading.Thread(target=self._accept, daemon=True, name=f"fk-{name}").start()

    # ------------------------------------------------------------ channel

    def env(self) -> dict[str, str]:
        """What the kit adds to the worker's environment."""
        return {
            CHANNEL_ENV: str(self._dir / "ch"),
            WORKER_ENV: self.name,
            "PGAPPNAME": f"fencekit-worker:{self.name}",
        }

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        f = conn.makefile("rwb", buffering=0)
        with contextlib.suppress(OSError, ValueError):
            for line in f:
                msg = json.loads(line)
                self._handle(msg, f)
        with contextlib.suppress(OSError):
            conn.close()

    def _handle(self, msg: dict[str, Any], f: _Writable) -> None:
        kind = msg.get("type")
        with self._cond:
            st = self._state
            if kind == "checkpoint":
                name = str(msg["name"])
                st.checkpoints.append(name)
                if self.pause_at == name and st.held is None and self.pause_at is not None:
                    st.held = _Held(f, name)
                    self.pause_at = None  # the first arrival only
                else:
                    f.write(b"go\n")
            elif kind == "metric":
                st.metric_events.append(msg)
            elif kind == "metrics":
                st.totals = Counter({(k, t, r): int(n) for k, t, r, n in msg["counts"]})
            elif kind == "outcome":
                st.outcome = msg
            self._cond.notify_all()

    # ------------------------------------------------------------ waiting

    def wait_for(self, name: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Wait until the worker has reached checkpoint ``name`` (held there if ``pause_at``).

        Raises :class:`WorkerError`, with the worker's output, when the worker exits first or
        ``timeout`` seconds pass.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while name not in self._state.checkpoints:
                if not self.alive:
                    self._cond.release()
                    try:
                        self._reap(1.0)
                    finally:
                        self._cond.acquire()
                    if name in self._state.checkpoints:
                        break
                    raise WorkerError(
                        f"worker {self.name} ended ({self.describe_end()}) before checkpoint "
                        f"{name!r}; checkpoints it reached: {self._state.checkpoints}\n"
                        f"{self.output_tail()}"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WorkerError(
                        f"worker {self.name} did not reach checkpoint {name!r} in {timeout:g}s "
                        f"(checkpoints it reached: {self._state.checkpoints}); does its code "
                        f"call fencekit.testing.checkpoint({name!r})?\n{self.output_tail()}"
                    )
                self._cond.wait(min(left, 0.1))

    @property
    def held_at(self) -> str | None:
        """The checkpoint the worker waits at for the test's go-ahead, if any."""
        with self._cond:
            return None if self._state.held is None else self._state.held.name

    def release(self) -> None:
        """Let a worker held at a checkpoint go on (it reads the answer when it runs)."""
        with self._cond:
            held, self._state.held = self._state.held, None
        if held is not None:
            with contextlib.suppress(OSError):
                held.file.write(b"go\n")

    # ------------------------------------------------------------ signals

    @property
    def pid(self) -> int:
        return int(self._proc.pid)

    @property
    def alive(self) -> bool:
        if self._proc is None:
            return False
        if isinstance(self._proc, subprocess.Popen):
            return self._proc.poll() is None
        return bool(self._proc.is_alive())

    @property
    def stopped(self) -> bool:
        return self._stopped

    def stop(self) -> None:
        """SIGSTOP: every thread of the worker stops, its lease renewal included. Returns once
        the kernel shows the process stopped (a signal is delivered asynchronously)."""
        sigstop(self.pid)
        self._stopped = True

    def cont(self) -> None:
        """SIGCONT."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)
        self._stopped = False

    def kill(self) -> None:
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)
            os.kill(self.pid, signal.SIGKILL)
        self._reap(10)

    # ------------------------------------------------------------ the end

    def _reap(self, timeout: float) -> bool:
        proc = self._proc
        if isinstance(proc, subprocess.Popen):
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                return False
        else:
            proc.join(timeout)
            if proc.exitcode is None:
                return False
        return True

    @property
    def exitcode(self) -> int | None:
        if isinstance(self._proc, subprocess.Popen):
            return self._proc.poll()
        return None if self._proc is None else self._proc.exitcode

    def join(self, timeout: float = DEFAULT_TIMEOUT) -> Outcome:
        """Wait for the worker to end and return its :class:`Outcome`.

        A worker still running after ``timeout`` is killed and :class:`WorkerError` raised.
        """
        if self._stopped:
            raise WorkerError(f"worker {self.name} is stopped (SIGSTOP): resume it before join")
        self.release()
        if not self._reap(timeout):
            self.kill()
            raise WorkerError(
                f"worker {self.name} did not end in {timeout:g}s (killed)\n{self.output_tail()}"
            )
        # The outcome and the totals arrive just before the process ends.
        deadline = time.monotonic() + 2.0
        with self._cond:
            while self._state.outcome is None and time.monotonic() < deadline:
                if isinstance(self._proc, subprocess.Popen):
                    break  # a command reports no outcome, only its exit code
                self._cond.wait(0.05)
        if self._on_exit is not None:
            self._on_exit(self)
        return self.outcome

    @property
    def outcome(self) -> Outcome:
        code = self.exitcode
        with self._cond:
            msg = self._state.outcome
        if msg is None:
            return Outcome(code, code == 0)
        return Outcome(code, bool(msg["ok"]), msg.get("value"), msg.get("error"))

    def describe_end(self) -> str:
        return self.outcome.describe() if self.exitcode is not None else "still running"

    # ------------------------------------------------------------ what it said

    @property
    def output(self) -> str:
        """Everything the worker printed (stdout and stderr)."""
        return self.log_path.read_text(errors="replace")

    def output_tail(self, lines: int = 25) -> str:
        text = self.output.rstrip("\n").splitlines()[-lines:]
        if not text:
            return f"  (worker {self.name} printed nothing)"
        return "\n".join([f"  output of worker {self.name} (last {len(text)} lines):"] + [
            f"  | {line}" for line in text
        ])  # fmt: skip

    @property
    def checkpoints(self) -> list[str]:
        with self._cond:
            return list(self._state.checkpoints)

    @property
    def rejections(self) -> list[dict[str, Any]]:
        """The fence rejections the worker's client saw, as they happened (table, reason,
        token, fence, key, lateness, message)."""
        with self._cond:
            return [e for e in self._state.metric_events if e["kind"] == "rejected"]

    @property
    def metrics(self) -> Counter[tuple[str, str, str]]:
        """The worker's :func:`fencekit.metrics.counts` (``(kind, table, reason) -> n``):
        the totals it sent at exit, else what it has forwarded so far."""
        with self._cond:
            if self._state.totals:
                return Counter(self._state.totals)
            return Counter((e["kind"], e["table"], e["reason"]) for e in self._state.metric_events)

    def close(self) -> None:
        """Kill the worker if it still runs, close the channel, remove its files."""
        if self.alive:
            self.kill()
        self.release()
        with contextlib.suppress(OSError):
            self._server.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __repr__(self) -> str:
        return f"<Worker {self.name} pid={getattr(self._proc, 'pid', None)} {self.describe_end()}>"


def sigstop(pid: int) -> None:
    """SIGSTOP ``pid`` and return once the kernel shows it stopped (a signal is delivered
    asynchronously: a go-ahead sent before that could still be read and acted on)."""
    os.kill(pid, signal.SIGSTOP)
    stat = Path(f"/proc/{pid}/stat")
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        try:
            state = stat.read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return  # no /proc (not Linux) or the process is gone
        if state in ("T", "t", "Z", "X"):
            return
        time.sleep(0.001)


def spawn(
    fn: Callable[..., Any],
    *args: Any,
    name: str = "worker",
    pause_at: str | None = None,
    env: dict[str, str] | None = None,
    on_exit: Callable[[Worker], None] | None = None,
    **kwargs: Any,
) -> Worker:
    """Start ``fn(*args, **kwargs)`` in a new process (``multiprocessing`` spawn).

    A coroutine function runs under ``asyncio.run``. ``fn`` and the arguments must pickle:
    define the worker function at module level in an importable module.
    """
    try:
        call = pickle.dumps((fn, args, kwargs))
    except Exception as exc:
        raise TypeError(
            f"cannot start {fn!r} as a worker process: {exc}. A worker must be a module-level "
            "function of an importable module, with picklable arguments (pass a DSN, not a "
            "connection)"
        ) from exc
    worker = Worker(name, pause_at=pause_at, on_exit=on_exit)
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(
        target=_bootstrap.run_callable,
        args=(call, {**(env or {}), **worker.env()}, str(worker.log_path)),
        name=f"fencekit-worker:{name}",
        daemon=False,
    )
    proc.start()
    worker._proc = proc
    return worker


def spawn_command(
    command: Sequence[str],
    *,
    name: str = "worker",
    pause_at: str | None = None,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    on_exit: Callable[[Worker], None] | None = None,
) -> Worker:
    """Start ``command`` as a worker; its checkpoints and metrics reach the test the same way
    (it finds the channel in its environment)."""
    worker = Worker(name, pause_at=pause_at, on_exit=on_exit)
    with open(worker.log_path, "ab") as log:
        worker._proc = subprocess.Popen(  # noqa: S603 - the test's own command
            list(command),
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {}), **worker.env()},
            cwd=cwd,
            start_new_session=True,
        )
    return worker
