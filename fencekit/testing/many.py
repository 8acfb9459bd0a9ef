"""Many workers, faults, a verdict: the chaos run for the user's own worker and tables.

:func:`run_many` starts ``copies`` processes that each run the user's worker function again and
again for ``seconds``, under the nemesis of ``fencekit chaos`` (:class:`fencekit.chaos.nemesis.
Nemesis`). It pauses a worker exactly at its checkpoint (``at``: ``computing``, after the lease
and the read, before the write), with SIGSTOP, until another worker has taken the lease over and
committed a write under the newer token; the paused worker then sends its write with its old
token: every pause makes a stale write, and a run with at least one pause has one. The nemesis
also kills workers (a replacement starts under a new name). The database's write history (what
each table accepted, under which token: :mod:`fencekit.testing.history`) and the grants of
fencekit's issuer then go to the chaos checker, which gives the same verdict ``fencekit chaos``
gives for fencekit's own register: lease safety, and per resource (a table's key) committed
tokens that never go down, no write accepted without a token. On a violation the run fails with
the checker's report and writes the HTML timeline (:mod:`fencekit.chaos.report`).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from fencekit.chaos.checker import Report, check, format_report
from fencekit.chaos.history import Event, HistoryWriter, read_events
from fencekit.chaos.nemesis import Nemesis
from fencekit.errors import FencingAssertionError, WorkerError
from fencekit.testing._bootstrap import UNTIL_ENV
from fencekit.testing._listen import listen
from fencekit.testing.assertions import current_database, describe
from fencekit.testing.channel import CHANNEL_ENV
from fencekit.testing.workers import sigstop

if TYPE_CHECKING:
    from fencekit.testing.database import FencedDatabase

__all__ = ["ManyResult", "run_many"]


@dataclass
class ManyResult:
    """The verdict of a many-worker run, its events, and where its files are."""

    report: Report
    events: list[Event]
    rejections: dict[str, dict[str, int]]
    workdir: Path | None  # None: a passing run's temporary directory, removed
    html: Path | None
    seconds: float

    def summary(self) -> str:
        """The checker's report, and the rejections fencekit counted in the database (the
        history holds accepted writes only: a rejected write rolled back)."""
        counted = "; ".join(
            f"{table} " + (", ".join(f"{r}={n}" for r, n in sorted(c.items()) if n) or "none")
            for table, c in sorted(self.rejections.items())
        )
        return f"{format_report(self.report)}\n  rejected by fencekit (counted): {counted}"


# The leases held now (expired ones too, until taken over), and whose connection was granted each.
_LEASES = """
SELECT l.resource, l.holder, l.token, g.app FROM fencekit.leases AS l
LEFT JOIN fencekit_testing.grants AS g
  ON g.resource = l.resource AND g.token = l.token AND g.event = 'acquire'
WHERE l.holder IS NOT NULL
"""

# Whether a newer holder of one of these leases has committed a write: the kit's write history
# holds a write carrying a token granted later for the same resource.
_OVERTAKEN = """
SELECT EXISTS (
  SELECT FROM unnest(%s::text[], %s::bigint[]) AS h(resource, token)
  JOIN fencekit_testing.grants AS g
    ON g.resource = h.resource AND g.event = 'acquire' AND g.token > h.token
  JOIN fencekit_testing.writes AS w ON w.token = g.token::text)
"""

# The longest pause, in ttls: the others had that long to take the lease over and write.
_HOLD_TTLS = 10.0

# A pause of a worker that holds no lease at its checkpoint (nothing to wait for), in ttls.
_PLAIN_TTLS = 2.0


def _pid_of(holder: str) -> str | None:
    """The process id in fencekit's default holder name, ``host:pid:random``."""
    return holder.split("#", 1)[0].split(":")[-2] if holder.count(":") >= 2 else None


class _Nemesis(Nemesis):
    """The chaos nemesis, pausing the user's workers at their checkpoint ``at``.

    Its pause action arms the checkpoint; the first worker to report it then is stopped there
    (SIGSTOP: its lease renewal stops too) and let past it (it reads the go-ahead once it runs
    again). It is resumed (SIGCONT) once another worker has taken its lease over and committed
    a write under the newer token, at most ``_HOLD_TTLS`` ttls after the pause: its write, next,
    carries a token older than one already written, every time. One worker is paused at a
    time (the others are there to take its lease over), a kill never takes the paused worker
    (that would lose its stale write), and at the run's end a paused worker still waits for
    its takeover while another worker is running.
    """

    kills = True

    def __init__(self, *, at: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.at = at
        self.reached = False  # a worker reported the checkpoint at all
        self._lock = threading.RLock()  # the channel's threads pause workers, the run resumes
        self._armed = False
        self._running = True
        self._held: dict[str, dict[str, int]] = {}  # paused worker -> its leases (resource: token)
        self._dir = Path(tempfile.mkdtemp(prefix="fk-many-"))  # short: a unix socket's path
        self._server = listen(str(self._dir / "ch"), 16, "fencekit-many", self._message)
        self.worker_env[CHANNEL_ENV] = str(self._dir / "ch")

    # ------------------------------------------------------------ the workers' checkpoints

    def _message(self, msg: dict[str, Any], f: Any) -> None:
        if msg.get("type") == "checkpoint" and not self._checkpoint(msg, f):
            f.write(b"go\n")

    def _checkpoint(self, msg: dict[str, Any], f: Any) -> bool:
        """Pause the worker that reported ``msg`` if the checkpoint is armed; True if paused
        (its go-ahead is sent)."""
        if msg.get("name") != self.at:
            return False
        with self._lock:
            self.reached = True
            name = next((n for n, p in self.procs.items() if p.pid == msg.get("pid")), None)
            proc = None if name is None else self.procs[name]
            if not self._armed or name is None or proc is None or proc.poll() is not None:
                return False
            self._armed = False
            try:
                sigstop(proc.pid)
            except ProcessLookupError:
                return False
            leases = self._leases(name, str(proc.pid))
            seconds = self.ttl * (_HOLD_TTLS if leases else _PLAIN_TTLS)
            self.paused[name] = time.monotonic() + seconds
            self._held[name] = leases
            self.history.append("pause", worker=name, seconds=round(seconds, 3), at=self.at)
            f.write(b"go\n")  # buffered: the worker reads it when it runs again
            return True

    # ------------------------------------------------------------ the database

    def _query(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        try:
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._conn = psycopg.connect(self.admin_dsn, autocommit=True, connect_timeout=2)
            return self._conn.execute(query, params).fetchall()
        except psycopg.Error:  # the nemesis's own connection: a pause then lasts its longest
            self._conn = None
            return []

    def _leases(self, name: str, pid: str) -> dict[str, int]:
        """The leases the worker holds: granted to its connections (their application_name
        names it, as the history records), or held under its process id (fencekit's default
        holder names)."""
        app = f"fencekit-worker:{name}"
        return {
            str(r): int(t)
            for r, h, t, a in self._query(_LEASES)
            if a == app or _pid_of(str(h)) == pid
        }

    def _overtaken(self, leases: dict[str, int]) -> bool:
        rows = self._query(_OVERTAKEN, (list(leases), list(leases.values())))
        return bool(rows and rows[0][0])

    # ------------------------------------------------------------ the nemesis's actions

    def spawn(self, slot: str) -> None:
        with self._lock:
            super().spawn(slot)

    def pause(self) -> None:
        with self._lock:
            if self._running and not self.paused:
                self._armed = True

    def resume_due(self, *, all_: bool = False) -> None:
        if all_ and self._running:
            self._drain()
        with self._lock:
            now = time.monotonic()
            for name in list(self.paused):
                leases = self._held.get(name)
                if leases and self._overtaken(leases):
                    self.paused[name] = now
            super().resume_due(all_=all_)
            for name in [n for n in self._held if n not in self.paused]:
                del self._held[name]

    def _drain(self) -> None:
        """The run's end: the workers start no new job, but one waiting for the paused
        worker's lease still takes it over and writes. Resume the paused worker after that,
        as during the run, not at once: else the last pause would test nothing."""
        with self._lock:
            self._armed = self._running = False
        while True:
            with self._lock:  # not while sleeping: the taking-over worker reports its checkpoint
                if not self.paused or all(n in self.paused for n in self._alive()):
                    return
                self.resume_due()
            time.sleep(0.05)

    def kill(self) -> None:
        if not self.kills:
            return
        with self._lock:
            alive = [n for n in self._alive() if n not in self.paused]
            if not alive:
                return
            name = self.rng.choice(alive)
            proc = self.procs[name]
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
            self.history.append("kill", worker=name)
            self.spawn(name.split(".", 1)[0])

    def close(self) -> None:
        with self._lock:
            self._armed = self._running = False
            super().close()
        self._server.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def _target(fn: Callable[..., Any] | str) -> str:
    if isinstance(fn, str):
        return fn
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or module == "__main__" or "<" in name:
        raise TypeError(f"run_many needs an importable module-level worker function, not {fn!r}")
    return f"{module}:{name}"


def run_many(
    fn: Callable[..., Any] | str,
    *args: Any,
    copies: int = 4,
    seconds: float = 20.0,
    ttl: float = 1.5,
    kills: bool = True,
    at: str = "computing",
    tables: tuple[str, ...] = (),
    seed: int | None = None,
    db: FencedDatabase | None = None,
    workdir: Path | None = None,
    **kwargs: Any,
) -> ManyResult:
    """Run ``copies`` workers doing ``fn(*args, **kwargs)`` over and over for ``seconds`` under
    the nemesis, then check the history; raise :class:`FencingAssertionError` on a violation.

    ``fn``: a module-level function (or ``"module:function"``); arguments must be JSON-able
    (a DSN, ids). ``ttl``: the worker's lease ttl (a pause lasts at most 10 of them).
    ``kills=False``: pauses only. ``at``: the checkpoint the nemesis pauses workers at (after the
    lease, before the write); a run whose workers never reach it raises :class:`WorkerError`,
    since it would test nothing. ``tables``: tables to judge although they have no fence
    (fenced tables are always judged). Files (worker output, history, the HTML timeline on failure)
    go to ``workdir``; by default to a new temporary directory that a passing run removes and a
    failing one keeps (its message names it).
    """
    __tracebackhide__ = True  # pytest: the failure is the message, not the kit's frames
    d = db or current_database()
    if not d.template.setup.history:
        raise ValueError("run_many needs the write history: build the database with history=True")
    for table in tables:
        d.track(table)
    work = Path(workdir or tempfile.mkdtemp(prefix="fencekit-many-"))
    work.mkdir(parents=True, exist_ok=True)
    target = _target(fn)
    spec = json.dumps({"args": list(args), "kwargs": kwargs})
    rng = random.Random(seed if seed is not None else time.time_ns())
    history = HistoryWriter(work / "nemesis.jsonl", "nemesis")
    started = time.monotonic()

    def command(name: str) -> list[str]:
        return [sys.executable, "-m", "fencekit.testing._bootstrap", "--name", name, target, spec]

    path = os.pathsep.join(p for p in sys.path if p)
    nemesis = _Nemesis(
        at=at, rng=rng, ttl=ttl, command=command, workdir=work, history=history, admin_dsn=d.dsn,
        progress=lambda _msg: None,
        worker_env={
            UNTIL_ENV: str(time.time() + seconds), "PYTHONPATH": path,
            "FENCEKIT_TEST_APP_DSN": d.app_dsn,
        },
    )  # fmt: skip
    nemesis.kills = kills
    try:
        nemesis.run([f"w{i + 1}" for i in range(copies)], seconds)
        nemesis.wait_workers(timeout=max(10.0, 4 * ttl))
    finally:
        nemesis.close()
        history.close()
    events = [*read_events(work / "nemesis.jsonl"), *d.history_events()]
    lease_bound = any(s.lease_bound for s in d.specs)
    report = check(events, scope="lease-bound" if lease_bound else "key", issuer="postgres")
    rejections = {s.table.dotted: d.rejections(s.table.dotted) for s in d.specs}
    result = ManyResult(report, events, rejections, work, None, time.monotonic() - started)
    if report.violations:
        result.html = _timeline(events, report, work, target)
        raise FencingAssertionError(
            f"{len(report.violations)} violation(s) in {copies} copies of {target} over "
            f"{seconds:g}s under pauses{' and kills' if kills else ''}:\n{format_report(report)}"
            f"\ntimeline: {result.html or '(plotly missing: pip install pg-fencekit[chaos])'}"
            f"\n{describe(d, lines=5)}\n{_logs(work)}\nfiles: {work}"
        )
    if not nemesis.reached:
        raise WorkerError(
            f"no worker of {copies} copies of {target} reached checkpoint {at!r} in {seconds:g}s, "
            f"so none was paused and the run tested nothing: call fencekit.testing.checkpoint"
            f"({at!r}) in the worker after it took its lease, before its write\n"
            f"{describe(d, lines=5)}\n{_logs(work)}\nfiles: {work}"
        )
    if workdir is None:
        shutil.rmtree(work, ignore_errors=True)
        result.workdir = None
    return result


def _logs(work: Path) -> str:
    return "\n".join(
        f"--- {p.stem}\n" + p.read_text(errors="replace")[-1500:]
        for p in sorted(work.glob("*.log"))[:6]
    )


def _timeline(events: list[Event], report: Report, work: Path, target: str) -> Path | None:
    try:
        from fencekit.chaos.report import write_html

        path = work / "timeline.html"
        write_html(events, report, path, title=f"fencekit.testing: {target}")
    except (ImportError, RuntimeError):
        return None
    return path
