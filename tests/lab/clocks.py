"""Faked clocks: libfaketime (Debian's ``faketime`` package) under workers and the server.

A process started with :meth:`FakeClock.env` in its environment reads its time (wall clock and
monotonic clock alike) through libfaketime, which re-reads a small file on every call; the
nemesis writes an offset there to step the clock forward or back, and moves the offset along
to run it fast or slow or to freeze it (in steps of the nemesis' tick, at most 0.5 s), then
writes ``+0`` to put it right. Each change is a ``clock`` history event (``fault`` true
while the clock is wrong). The history itself is timed by the true clock
(:func:`fencekit.chaos.history.true_time`), so the checker's real-time reasoning holds.

libfaketime shares a POSIX semaphore and a shared-memory file among the processes of one
faked clock (``FAKETIME_SHARED``). A process that finds none makes its own pair,
``/dev/shm/sem.faketime_sem_<pid>`` and ``/dev/shm/faketime_shm_<pid>``, and removes it only
when it exits normally: every worker the nemesis kills, every server crash, and every process
that exec()s (env(1) before pg_ctl) left a pair behind, and a later process that got the same
pid could not make its own ("sem_open failed ... Permission denied" when the pair was root's
and the process the server's user). So each clock makes its own pair, hands its names to
every process, and removes it when the run is over.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import random
import secrets
import tempfile
import time
from pathlib import Path

__all__ = ["FakeClock", "find_libfaketime"]

_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
)


def find_libfaketime() -> str | None:
    env = os.environ.get("FENCEKIT_LIBFAKETIME")
    for c in ([env] if env else []) + list(_CANDIDATES):
        if Path(c).is_file():
            return c
    return None


_SHM = Path("/dev/shm")


class SharedPair:
    """The semaphore and shared memory libfaketime's processes share (``FAKETIME_SHARED``),
    made and removed by the lab instead of by the first process that loads the library."""

    def __init__(self, label: str) -> None:
        tag = f"fencekit_faketime_{label}_{os.getpid()}_{secrets.token_hex(4)}"
        self.sem_name = f"/{tag}_sem"
        self.shm_name = f"/{tag}_shm"
        # Where glibc keeps them: sem_open("/x") is /dev/shm/sem.x, shm_open("/y") /dev/shm/y.
        self.files = (_SHM / f"sem.{self.sem_name[1:]}", _SHM / self.shm_name[1:])
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        sem_open = libc.sem_open
        sem_open.restype = ctypes.c_void_p
        sem_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_uint]
        sem = sem_open(self.sem_name.encode(), os.O_CREAT | os.O_EXCL, 0o600, 1)
        if not sem:
            err = ctypes.get_errno()
            raise OSError(err, f"sem_open {self.sem_name}: {os.strerror(err)}")
        libc.sem_close(ctypes.c_void_p(sem))
        # libfaketime's own size for it (a tick counter; the page around it reads as zeros).
        fd = os.open(self.files[1], os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, 8)
        finally:
            os.close(fd)
        for f in self.files:
            os.chmod(f, 0o666)  # a server's processes open both as the server's user

    @property
    def env_value(self) -> str:
        return f"{self.sem_name} {self.shm_name}"

    def remove(self) -> None:
        for f in self.files:
            f.unlink(missing_ok=True)


class FakeClock:
    """One faked clock (a target: ``workers`` or ``server``), driven through its file."""

    def __init__(self, target: str, library: str) -> None:
        self.target = target
        self.library = library
        self.dir = Path(tempfile.mkdtemp(prefix=f"fencekit-chaos-clock-{target}-"))
        os.chmod(self.dir, 0o755)  # the server reads it as the postgres user
        self.path = self.dir / "faketimerc"
        self.shared = SharedPair(target)
        self.spec = "+0"
        self._base = 0.0  # offset (s) at the fault's start
        self._drift = 0.0  # s gained per true second while faulted
        self._since = 0.0
        self.set("+0")

    def env(self) -> dict[str, str]:
        return {
            "LD_PRELOAD": self.library,
            "FAKETIME_TIMESTAMP_FILE": str(self.path),
            "FAKETIME_NO_CACHE": "1",
            "FAKETIME_SHARED": self.shared.env_value,
        }

    def set(self, spec: str) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(spec + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.path)  # atomic: a reader never sees half a spec
        self.spec = spec

    def random_fault(self, rng: random.Random, ttl: float, *, freeze: bool) -> tuple[str, str]:
        """Choose a random fault; :meth:`tick` applies it (record it first: a history must
        never show a fault starting after its effects). Returns (kind, description).

        Every fault is an offset from the true time. libfaketime's own rate and absolute
        specifications are not used: a rate counts from each process's start and outlives the
        specification that set it (a later ``+0`` keeps the old rate), so a "fast" clock would
        jump by the process's age and never come right. Skews and freezes are offsets that
        :meth:`tick` moves along with the true clock instead.
        """
        kinds = ["step forward", "step back", "fast", "slow"] + (["freeze"] if freeze else [])
        kind = rng.choice(kinds)
        step = round(ttl * rng.uniform(2.0, 8.0), 3)
        self._since = time.monotonic()
        self._base = {"step forward": step, "step back": -step}.get(kind, 0.0)
        # seconds the faked clock gains per true second
        self._drift = {"fast": 1.0, "slow": -0.5, "freeze": -1.0}.get(kind, 0.0)
        what = {
            "step forward": f"+{step:g} s",
            "step back": f"-{step:g} s",
            "fast": "runs at 2x",
            "slow": "runs at 0.5x",
            "freeze": "stands still",
        }[kind]
        return kind, what

    def tick(self) -> None:
        """Move a skewed or frozen clock's offset along (called every nemesis step)."""
        if self._drift or self._base:
            offset = self._base + self._drift * (time.monotonic() - self._since)
            self.set(f"{offset:+.3f}")

    def reset(self) -> None:
        self._base = self._drift = 0.0
        self.set("+0")

    def close(self) -> None:
        for p in (self.path, self.path.with_suffix(".tmp")):
            p.unlink(missing_ok=True)
        os.rmdir(self.dir) if self.dir.exists() else None
        self.shared.remove()
