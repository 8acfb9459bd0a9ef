"""Many workers, faults, a verdict: the chaos run for the user's own worker and tables.

:func:`run_many` starts ``copies`` processes that each run the user's worker function again and
again for ``seconds``, while the nemesis of ``fencekit chaos`` (:class:`fencekit.chaos.nemesis.
Nemesis`) pauses them past their leases (SIGSTOP for 1.5 to 3 lease ttls, and until another
worker has taken the lease over) and kills them (a replacement starts under a new name). The
database's write history (what each table accepted, under which token:
:mod:`fencekit.testing.history`) and the grants of fencekit's issuer then go to the chaos
checker, which gives the same verdict ``fencekit chaos`` gives for fencekit's own register:
lease safety, and per resource (a table's key) committed tokens that never go down, no write
accepted without a token. On a violation the run fails with the checker's report and writes the
HTML timeline (:mod:`fencekit.chaos.report`).
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fencekit.chaos.checker import Report, check, format_report
from fencekit.chaos.history import Event, HistoryWriter, read_events
from fencekit.chaos.nemesis import Nemesis
from fencekit.errors import FencingAssertionError
from fencekit.testing._bootstrap import UNTIL_ENV
from fencekit.testing.assertions import current_database, describe

if TYPE_CHECKING:
    from fencekit.testing.database import FencedDatabase

__all__ = ["ManyResult", "run_many"]


@dataclass
class ManyResult:
    """The verdict of a many-worker run, its events, and where its files are."""

    report: Report
    events: list[Event]
    rejections: dict[str, dict[str, int]]
    workdir: Path
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


# The token of every lease now, held or not (a released lease keeps its last token).
_LEASE_TOKENS = "SELECT l.resource, l.holder, l.token FROM fencekit.leases AS l"

# How long a pause may be held past its own length while nobody takes the lease over, in ttls.
_HOLD_TTLS = 10.0

# Whether a committed write already carries one of these tokens (the kit's write history).
_WRITTEN = "SELECT EXISTS (SELECT FROM fencekit_testing.writes AS w WHERE w.token = ANY (%s))"


class _Nemesis(Nemesis):
    """The chaos nemesis, told which of the user's workers holds a lease now: fencekit's
    default holder names are ``host:pid:random``, so a holder is matched by its process id.
    It pauses only holders (a pause then lands between a read and its write, the pause that
    matters), not a worker still starting or waiting for a lease. A pause lasts until another
    worker has taken the lease over (its token moved on), not only its 1.5 to 3 ttls: on a busy
    machine the others can need longer than that to get there, and a pause that ends before
    the takeover tests nothing. It is held at most ``_HOLD_TTLS`` ttls more. A pause that lands
    after the holder's write under its token has committed ends at once: it tests nothing
    either, and the next pause comes sooner.
    """

    kills = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._held: dict[str, tuple[dict[str, int], float]] = {}

    def _pid_of(self, holder: str) -> str | None:
        return holder.split("#", 1)[0].split(":")[-2] if holder.count(":") >= 2 else None

    def _holders(self) -> set[str]:
        pids = {self._pid_of(h) for h in super()._holders()}
        return {name for name, proc in self.procs.items() if str(proc.pid) in pids}

    def _tokens(self) -> list[tuple[str, str | None, int]]:
        try:
            if self._conn is None or self._conn.closed or self._conn.broken:
                return []
            return [(str(r), h, int(t)) for r, h, t in self._conn.execute(_LEASE_TOKENS)]
        except Exception:  # the nemesis's own connection: a failure only ends a hold early
            return []

    def _written(self, tokens: list[int]) -> bool:
        try:
            if not tokens or self._conn is None or self._conn.closed or self._conn.broken:
                return False
            row = self._conn.execute(_WRITTEN, ([str(t) for t in tokens],)).fetchone()
            return bool(row and row[0])
        except Exception:  # the nemesis's own connection: a failure keeps the pause
            return False

    def pause(self) -> None:
        if not self._holders() - set(self.paused):
            return
        before = set(self.paused)
        super().pause()
        for name in set(self.paused) - before:
            pid = str(self.procs[name].pid)
            held = {r: t for r, h, t in self._tokens() if h and self._pid_of(str(h)) == pid}
            if self._written(list(held.values())):
                # The holder's write under this token is committed: a pause now can no longer
                # make it stale. End it at once, so the next pause comes sooner.
                self.paused[name] = time.monotonic()
                continue
            self._held[name] = (held, self.paused[name] + _HOLD_TTLS * self.ttl)

    def resume_due(self, *, all_: bool = False) -> None:
        if not all_:
            now = time.monotonic()
            tokens = {r: t for r, _h, t in self._tokens()}
            for name, at in list(self.paused.items()):
                held, until = self._held.get(name, ({}, 0.0))
                waiting = any(tokens.get(r, t) <= t for r, t in held.items())
                if at <= now < until and waiting:
                    self.paused[name] = now + 0.1  # not taken over yet: look again soon
        super().resume_due(all_=all_)
        for name in [n for n in self._held if n not in self.paused]:
            del self._held[name]

    def kill(self) -> None:
        if self.kills:
            super().kill()


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
    tables: tuple[str, ...] = (),
    seed: int | None = None,
    db: FencedDatabase | None = None,
    workdir: Path | None = None,
    **kwargs: Any,
) -> ManyResult:
    """Run ``copies`` workers doing ``fn(*args, **kwargs)`` over and over for ``seconds`` under
    the nemesis, then check the history; raise :class:`FencingAssertionError` on a violation.

    ``fn``: a module-level function (or ``"module:function"``); arguments must be JSON-able
    (a DSN, ids). ``ttl``: the worker's lease ttl (the nemesis pauses for 1.5 to 3 of them).
    ``kills=False``: pauses only. ``tables``: tables to judge although they have no fence
    (fenced tables are always judged). Files (worker output, history, the HTML timeline on failure)
    go to ``workdir`` (default: a new temporary directory).
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
        rng=rng, ttl=ttl, command=command, workdir=work, history=history, admin_dsn=d.dsn,
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
        logs = "\n".join(
            f"--- {p.stem}\n" + p.read_text(errors="replace")[-1500:]
            for p in sorted(work.glob("*.log"))[:6]
        )
        raise FencingAssertionError(
            f"{len(report.violations)} violation(s) in {copies} copies of {target} over "
            f"{seconds:g}s under pauses{' and kills' if kills else ''}:\n{format_report(report)}"
            f"\ntimeline: {result.html or '(plotly missing: pip install pg-fencekit[chaos])'}"
            f"\n{describe(d, lines=5)}\n{logs}"
        )
    return result


def _timeline(events: list[Event], report: Report, work: Path, target: str) -> Path | None:
    try:
        from fencekit.chaos.report import write_html

        path = work / "timeline.html"
        write_html(events, report, path, title=f"fencekit.testing: {target}")
    except (ImportError, RuntimeError):
        return None
    return path
