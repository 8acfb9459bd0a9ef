"""The nemesis: pauses workers past their lease and kills them; runs the faults it is given.

It owns the worker processes. One action at a time, at seeded random intervals:

- ``pause``: SIGSTOP a worker (preferably one that holds a lease now, by the database's
  ``fencekit.leases_current``) for 1.5 to 3 ttls, then SIGCONT: it resumes mid-computation with
  a token that has gone stale.
- ``kill``: SIGKILL a worker (possibly mid-write: its outcome is unknown) and start a
  replacement under a new name.
- any :class:`Fault` it is given. fencekit's own run against your database has none; the lab
  (tests/lab/chaos.py, in a checkout) adds server crashes, pgbouncer paused with commits in
  flight, faked clocks and issuer nodes killed or paused, on servers it starts itself.

A short run still gets at least one kill, and each fault at least once (by its ``due``).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg

from fencekit.chaos.history import HistoryWriter

__all__ = ["Fault", "Nemesis"]

_HOLDERS = "SELECT holder FROM fencekit.leases_current"


class Fault:
    """A fault the nemesis can inject besides pausing and killing workers.

    Subclasses set ``kind`` (a name, unique per run) and implement :meth:`inject`. The nemesis
    picks a fault with probability ``weight`` (pause: 5, kill: 1, nothing: 2) when
    :meth:`ready`, and forces it once the run is ``due`` (a fraction) through if it has not
    happened yet.
    """

    kind = "fault"
    weight = 1.5
    due: float | None = 0.2

    def ready(self, elapsed: float, remaining: float) -> bool:
        """May the fault happen now (``elapsed`` / ``remaining`` seconds of the run)?"""
        return True

    def inject(self, nemesis: Nemesis) -> tuple[float, Callable[[], None]] | None:
        """Inject the fault; return (seconds, undo) for the nemesis to undo it later."""
        raise NotImplementedError

    def tick(self) -> None:
        """Called every step (e.g. a faked clock that moves on its own)."""


class Nemesis:
    def __init__(
        self,
        *,
        rng: random.Random,
        ttl: float,
        command: Callable[[str], list[str]],
        workdir: Path,
        history: HistoryWriter,
        admin_dsn: str,
        progress: Callable[[str], None],
        faults: Sequence[Fault] = (),
        worker_env: dict[str, str] | None = None,
    ) -> None:
        self.rng = rng
        self.ttl = ttl
        self.command = command
        self.workdir = workdir
        self.history = history
        self.admin_dsn = admin_dsn
        self.progress = progress
        self.faults = list(faults)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.paused: dict[str, float] = {}  # name -> resume at (monotonic)
        self.generation: dict[str, int] = {}
        self._conn: psycopg.Connection[Any] | None = None
        # Faults to undo: kind -> (at, monotonic; undo). One of each kind at a time.
        self.pending: dict[str, tuple[float, Callable[[], None]]] = {}
        self.worker_env = {**os.environ, **(worker_env or {})}

    # ------------------------------------------------------------ workers

    def spawn(self, slot: str) -> None:
        gen = self.generation.get(slot, 0) + 1
        self.generation[slot] = gen
        name = slot if gen == 1 else f"{slot}.{gen}"
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115  # the child owns it
        try:
            self.procs[name] = subprocess.Popen(
                self.command(name), stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, env=self.worker_env,
            )  # fmt: skip
        finally:
            log.close()
        if gen > 1:
            self.history.append("spawn", worker=name)

    def _alive(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.poll() is None]

    def _holders(self) -> set[str]:
        try:
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._conn = psycopg.connect(self.admin_dsn, autocommit=True, connect_timeout=2)
            rows = self._conn.execute(_HOLDERS).fetchall()
        except psycopg.Error:
            self._conn = None
            return set()
        return {str(h).split("#", 1)[0] for (h,) in rows if h}

    def pause(self) -> None:
        alive = [n for n in self._alive() if n not in self.paused]
        if not alive:
            return
        holding = [n for n in alive if n in self._holders()]
        name = self.rng.choice(holding or alive)
        seconds = self.ttl * self.rng.uniform(1.5, 3.0)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.procs[name].pid, signal.SIGSTOP)
            self.paused[name] = time.monotonic() + seconds
            self.history.append("pause", worker=name, seconds=round(seconds, 3))

    def undo_now(self, kind: str) -> None:
        """Undo a pending fault at once (e.g. a paused pgbouncer before a server crash)."""
        if kind in self.pending:
            self.pending.pop(kind)[1]()

    def reconnect(self) -> None:
        """Drop the nemesis's own connection (after a fault that broke it)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def resume_due(self, *, all_: bool = False) -> None:
        for fault in self.faults:
            fault.tick()
        now = time.monotonic()
        for key, (at, undo) in list(self.pending.items()):
            if all_ or at <= now:
                del self.pending[key]
                undo()
        for name, at in list(self.paused.items()):
            if all_ or at <= now:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.procs[name].pid, signal.SIGCONT)
                del self.paused[name]
                self.history.append("resume", worker=name)

    def kill(self) -> None:
        alive = self._alive()
        if not alive:
            return
        name = self.rng.choice(alive)
        proc = self.procs[name]
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        self.paused.pop(name, None)
        self.history.append("kill", worker=name)
        self.spawn(name.split(".", 1)[0])

    # ------------------------------------------------------------ the run

    def run(self, slots: list[str], seconds: float) -> None:
        """Start the workers and inject faults for ``seconds``; the workers stop by themselves."""
        for slot in slots:
            self.spawn(slot)
        t0 = time.monotonic()
        end = t0 + seconds
        kills = 0
        done: set[str] = set()
        step = 0
        while time.monotonic() < end and step < 100_000:
            step += 1
            self.resume_due()
            time.sleep(min(self.rng.uniform(0.15, 0.5), max(0.0, end - time.monotonic())))
            now = time.monotonic()
            if now >= end:
                break
            elapsed, remaining = now - t0, end - now
            ready = [f for f in self.faults if f.kind not in self.pending]
            ready = [f for f in ready if f.ready(elapsed, remaining)]
            choices: list[str | Fault] = ["pause", "kill", "none", *ready]
            weights = [5.0, 1.0, 2.0, *(f.weight for f in ready)]
            action = self.rng.choices(choices, weights)[0]
            owed = [f for f in ready if f.kind not in done and f.due is not None]
            owed = [f for f in owed if elapsed > seconds * (f.due or 0.0)]
            if owed:
                action = owed[0]  # every fault at least once, even in a short run
            elif kills == 0 and elapsed > seconds * 0.6:
                action = "kill"
            if isinstance(action, Fault):
                done.add(action.kind)
                undo = action.inject(self)
                if undo is not None:
                    self.pending[action.kind] = (time.monotonic() + undo[0], undo[1])
            elif action == "pause":
                self.pause()
            elif action == "kill":
                self.kill()
                kills += 1
        self.resume_due(all_=True)

    def wait_workers(self, timeout: float) -> None:
        """Wait for the workers to finish; SIGKILL those still running after ``timeout``."""
        deadline = time.monotonic() + timeout
        for name, proc in self.procs.items():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
                self.progress(f"nemesis: worker {name} did not stop in time; killed")

    def close(self) -> None:
        self.resume_due(all_=True)
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
        if self._conn is not None:
            self._conn.close()
