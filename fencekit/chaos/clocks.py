"""Faked clocks: libfaketime (Debian's ``faketime`` package) under workers and the server.

A process started with :meth:`FakeClock.env` in its environment reads its time (wall clock and
monotonic clock alike) through libfaketime, which re-reads a small file on every call; the
nemesis writes that file to step the clock forward or back, run it fast or slow, or freeze it,
and writes ``+0`` to put it right. Each change is a ``clock`` history event (``fault`` true
while the clock is wrong). The history itself is timed by the true clock
(:func:`fencekit.chaos.history.true_time`), so the checker's real-time reasoning holds.
"""

from __future__ import annotations

import os
import random
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


class FakeClock:
    """One faked clock (a target: ``workers`` or ``server``), driven through its file."""

    def __init__(self, target: str, library: str) -> None:
        self.target = target
        self.library = library
        self.dir = Path(tempfile.mkdtemp(prefix=f"fencekit-chaos-clock-{target}-"))
        os.chmod(self.dir, 0o755)  # the server reads it as the postgres user
        self.path = self.dir / "faketimerc"
        self.spec = "+0"
        self.set("+0")

    def env(self) -> dict[str, str]:
        return {
            "LD_PRELOAD": self.library,
            "FAKETIME_TIMESTAMP_FILE": str(self.path),
            "FAKETIME_NO_CACHE": "1",
        }

    def set(self, spec: str) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(spec + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.path)  # atomic: a reader never sees half a spec
        self.spec = spec

    def random_fault(self, rng: random.Random, ttl: float, *, freeze: bool) -> tuple[str, str]:
        """Put a random fault on the clock; returns (kind, libfaketime spec)."""
        kinds = ["step forward", "step back", "fast", "slow"] + (["freeze"] if freeze else [])
        kind = rng.choice(kinds)
        step = round(ttl * rng.uniform(2.0, 8.0), 3)
        spec = {
            "step forward": f"+{step}",
            "step back": f"-{step}",
            "fast": "+0 x2.0",
            "slow": "+0 x0.5",
            "freeze": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime()),
        }[kind]
        self.set(spec)
        return kind, spec

    def reset(self) -> None:
        self.set("+0")

    def close(self) -> None:
        for p in (self.path, self.path.with_suffix(".tmp")):
            p.unlink(missing_ok=True)
        os.rmdir(self.dir) if self.dir.exists() else None
