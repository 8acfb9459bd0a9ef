"""The nemesis: pauses workers past their lease, kills them, crash-restarts PostgreSQL.

It owns the worker processes. One action at a time, at seeded random intervals:

- ``pause``: SIGSTOP a worker (preferably one that holds a lease now, by the database's
  ``fencekit.leases_current``) for 1.5 to 3 ttls, then SIGCONT: it resumes mid-computation with
  a token that has gone stale.
- ``kill``: SIGKILL a worker (possibly mid-write: its outcome is unknown) and start a
  replacement under a new name.
- ``crash``: ``pg_ctl stop -m immediate``, then, with pgbouncer, restart pgbouncer while the
  server is down, then start the server again (recovery from the WAL).

- ``clock`` (with clock faults on): step a faked clock (the workers' or the PostgreSQL
  server's: :mod:`fencekit.chaos.clocks`) forward or back, run it fast or slow, or freeze the
  workers' clock, for 1 to 3 s, then put it right.
- ``net`` (with network faults on): SIGSTOP pgbouncer for 1.5 to 2.5 s: every connection hangs,
  commits in flight included, so their writers do not know whether they landed.
- ``node`` (with an etcd or ZooKeeper cluster): SIGKILL the cluster's leader and restart it
  1 to 2 s later, or SIGSTOP a member for 1 to 2.5 s.

A short run still gets at least one kill and, when crashes are possible, one crash; each
enabled extra fault happens at least once.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from fencekit.chaos.clocks import FakeClock
from fencekit.chaos.clusters import Cluster
from fencekit.chaos.history import HistoryWriter
from fencekit.chaos.server import Bouncer, ControlledServer

__all__ = ["Nemesis"]

_HOLDERS = "SELECT holder FROM fencekit.leases_current"


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
        server: ControlledServer | None,
        bouncer: Bouncer | None,
        progress: Callable[[str], None],
        clocks: dict[str, FakeClock] | None = None,
        net_faults: bool = False,
        cluster: Cluster | None = None,
    ) -> None:
        self.rng = rng
        self.ttl = ttl
        self.command = command
        self.workdir = workdir
        self.history = history
        self.admin_dsn = admin_dsn
        self.server = server
        self.bouncer = bouncer
        self.progress = progress
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.paused: dict[str, float] = {}  # name -> resume at (monotonic)
        self.generation: dict[str, int] = {}
        self._conn: psycopg.Connection[Any] | None = None
        self.clocks = clocks or {}
        self.net_faults = net_faults and bouncer is not None
        self.cluster = cluster
        # Faults to undo: (at, monotonic; what). One of each kind at a time.
        self.pending: dict[str, tuple[float, Callable[[], None]]] = {}
        worker_clock = self.clocks.get("workers")
        self.worker_env = {**os.environ, **(worker_clock.env() if worker_clock else {})}

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

    # ------------------------------------------------------------ clocks, network, cluster

    def clock(self) -> None:
        free = [t for t in self.clocks if f"clock:{t}" not in self.pending]
        if not free:
            return
        target = self.rng.choice(sorted(free))
        fake = self.clocks[target]
        # A frozen server clock stalls every lease; freezing is for the workers' clocks.
        kind, what = fake.random_fault(self.rng, self.ttl, freeze=target == "workers")
        # Recorded before it takes effect, put right before "put right" is recorded: the
        # history's fault window always covers the clock's wrong time.
        self.history.append("clock", target=target, fault=kind, what=what)
        fake.tick()

        def undo() -> None:
            fake.reset()
            self.history.append("clock", target=target, fault=None, what="put right")

        self.pending[f"clock:{target}"] = (time.monotonic() + self.rng.uniform(1.0, 3.0), undo)

    def net(self) -> None:
        if not self.net_faults or "net" in self.pending or self.bouncer is None:
            return
        bouncer = self.bouncer
        self.history.append("net", fault="pgbouncer paused (SIGSTOP)")  # before it happens
        if not bouncer.pause():
            self.history.append("net", fault=None, action="pgbouncer not running")
            return

        def undo() -> None:
            bouncer.resume()
            self.history.append("net", fault=None, action="pgbouncer resumed (SIGCONT)")

        self.pending["net"] = (time.monotonic() + self.rng.uniform(1.5, 2.5), undo)

    def node(self) -> None:
        cluster = self.cluster
        if cluster is None or "node" in self.pending:
            return
        if self.rng.random() < 0.5:
            leader = cluster.leader()
            if leader is None:
                return
            leader.kill()
            self.history.append("node", fault="leader killed (SIGKILL)", node=leader.name)

            def undo() -> None:
                try:
                    cluster.restart(leader, timeout=30)
                except Exception as exc:  # the run goes on with two members
                    self.progress(f"nemesis: {leader.name} did not come back: {exc}")
                self.history.append("node", fault=None, action="restarted", node=leader.name)

            self.pending["node"] = (time.monotonic() + self.rng.uniform(1.0, 2.0), undo)
            return
        member = self.rng.choice([n for n in cluster.nodes if n.running])
        member.signal(signal.SIGSTOP)
        member.paused = True
        self.history.append("node", fault="member paused (SIGSTOP)", node=member.name)

        def resume() -> None:
            member.signal(signal.SIGCONT)
            member.paused = False
            self.history.append("node", fault=None, action="resumed", node=member.name)

        self.pending["node"] = (time.monotonic() + self.rng.uniform(1.0, 2.5), resume)

    def resume_due(self, *, all_: bool = False) -> None:
        for fake in self.clocks.values():
            fake.tick()
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

    # ------------------------------------------------------------ server

    def crash(self) -> None:
        if self.server is None:
            return
        self.progress("nemesis: crash-restarting PostgreSQL (immediate shutdown)")
        if "net" in self.pending:  # a paused pgbouncer cannot be restarted: resume it first
            self.pending.pop("net")[1]()
        self.server.crash()
        self.history.append("crash")
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self.bouncer is not None:
            self.bouncer.stop()
            self.bouncer.start()
            self.history.append("bouncer", action="restart")
        time.sleep(self.rng.uniform(0.1, 0.5))
        started = time.monotonic()
        self.server.start()
        self.history.append("restart")
        self.progress(f"nemesis: PostgreSQL back after {time.monotonic() - started:.1f}s")

    # ------------------------------------------------------------ the run

    def run(self, slots: list[str], seconds: float) -> None:
        """Start the workers and inject faults for ``seconds``; the workers stop by themselves."""
        for slot in slots:
            self.spawn(slot)
        t0 = time.monotonic()
        end = t0 + seconds
        crash_gap = max(3.0, seconds / 4)
        last_crash = t0 - crash_gap / 2
        crashes = kills = 0
        extra = {"clock": bool(self.clocks), "net": self.net_faults, "node": bool(self.cluster)}
        done: set[str] = set()
        step = 0
        while time.monotonic() < end and step < 100_000:
            step += 1
            self.resume_due()
            time.sleep(min(self.rng.uniform(0.15, 0.5), max(0.0, end - time.monotonic())))
            now = time.monotonic()
            if now >= end:
                break
            # No crash in the last seconds: the run must also show writes after recovery.
            can_crash = self.server is not None and now - last_crash >= crash_gap and end - now > 3
            weights = [5.0, 1.0, 1.0 if can_crash else 0.0, 2.0]
            weights += [1.5 if extra[k] else 0.0 for k in ("clock", "net", "node")]
            kinds = ["pause", "kill", "crash", "none", "clock", "net", "node"]
            action = self.rng.choices(kinds, weights)[0]
            owed = [k for k, on in extra.items() if on and k not in done]
            if can_crash and crashes == 0 and now - t0 > seconds * 0.45:
                action = "crash"  # a short run still proves recovery
            elif kills == 0 and now - t0 > seconds * 0.6:
                action = "kill"
            elif owed and now - t0 > seconds * (0.2 + 0.12 * len(done)):
                action = owed[0]  # every enabled fault at least once
            if action in extra:
                done.add(action)
                getattr(self, action)()
            if action == "pause":
                self.pause()
            elif action == "kill":
                self.kill()
                kills += 1
            elif action == "crash":
                self.crash()
                crashes += 1
                last_crash = time.monotonic()
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
