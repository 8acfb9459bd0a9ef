"""The chaos history: append-only JSON lines, one file per process, fsync'd, merged after.

Every process (each worker, the nemesis) appends its own events to its own file, so nothing is
shared while the run is going on and a SIGKILL loses at most the line being written. Each line
is flushed and fsync'd before the process acts on it: a write's ``invoke`` line is on disk
before the write is sent, so a worker killed mid-write leaves an invoke without a completion,
which the checker reads as an unknown outcome.

Event kinds (``type``):

- ``session``: who a worker is connected as (its first connection: role, superuser or not,
  role memberships); the checker ignores it
- ``acquire``: a worker got a lease (resource, token)
- ``invoke``: a write is about to be sent (write id, resource, token or null, observed, value)
- ``ok`` / ``fail`` / ``info``: its outcome: acknowledged (with the per-resource ``seq`` the
  server assigned), rejected / not applied (with the reason), or unknown (connection lost
  during commit)
- ``renew`` / ``release`` / ``lost``: a holder's lease renewed (with ``t0``, when the request
  was sent), released, or reported lost by the issuer (``renew`` answered False; with the
  issuer's ``reason`` when it gave one)
- ``loss`` / ``log``: diagnostics the checker ignores: the issuer's own loss signal for a grant
  (``watch_loss``: when the issuer decided, and why), and the issuer client's log lines
  (kazoo's connection states, fencekit.leases' warnings), so a failed run can be explained
- ``pause`` / ``resume`` / ``kill`` / ``spawn`` / ``crash`` / ``restart`` / ``bouncer`` /
  ``clock`` / ``net`` / ``node``: the nemesis
- ``run``: written once by the run: scope, issuer, whether the register was fenced
- ``committed`` / ``register``: the database's final state, appended after the run (every row
  of ``chaos_log``, and each register's value and write count), so that a saved history is
  checkable alone (``fencekit chaos check HISTORY``)

Times (``t``, ``t0``) come from the machine's true real-time clock (:func:`true_time`), read
with a direct system call: a process whose clock libfaketime steps, skews or freezes still
records when things really happened.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import platform
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TextIO

from fencekit.errors import HistoryError

__all__ = [
    "Event",
    "HistoryWriter",
    "load_history",
    "merge",
    "read_events",
    "true_time",
    "write_merged",
]


Event = dict[str, Any]

# clock_gettime's system call number: libfaketime replaces the C library's clock_gettime, not
# the kernel's, so the system call reads the true clock even in a process under libfaketime.
_SYS_CLOCK_GETTIME = {"x86_64": 228, "aarch64": 113}.get(platform.machine())


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _true_clock() -> Callable[[], float] | None:
    if _SYS_CLOCK_GETTIME is None or os.name != "posix":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    except OSError:
        return None
    ts = _Timespec()

    def read() -> float:
        if libc.syscall(_SYS_CLOCK_GETTIME, 0, ctypes.byref(ts)) != 0:  # 0: CLOCK_REALTIME
            return time.time()
        return float(ts.tv_sec) + float(ts.tv_nsec) / 1e9

    return read


_TRUE_CLOCK = _true_clock()


def true_time() -> float:
    """Seconds since the epoch by the kernel's clock, whatever libfaketime makes time.time()
    answer in this process (falls back to time.time() where the system call is unknown)."""
    if _TRUE_CLOCK is None:
        return time.time()
    return float(_TRUE_CLOCK())


class HistoryWriter:
    """Append events to one JSON-lines file, each one durable before ``append`` returns."""

    def __init__(self, path: Path, process: str) -> None:
        self.path = path
        self.process = process
        self._fh: TextIO = open(path, "a", encoding="utf-8")  # noqa: SIM115  # closed in close()
        self._n = 0
        self._lock = threading.Lock()

    def append(self, type_: str, **data: Any) -> Event:
        return self._write(type_, data, durable=True)

    def note(self, type_: str, **data: Any) -> Event:
        """Append a diagnostic event nothing acts on, without the fsync: it is written from
        the issuer's threads (kazoo's connection thread among them), which must not wait on
        the disk."""
        return self._write(type_, data, durable=False)

    def _write(self, type_: str, data: dict[str, Any], durable: bool) -> Event:
        # The issuer's threads (loss callbacks, its client's log) append too.
        with self._lock:
            self._n += 1
            event: Event = {
                "t": true_time(), "p": self.process, "n": self._n, "type": type_, **data
            }  # fmt: skip
            if self._fh.closed:  # a late diagnostic from a thread, after close()
                return event
            self._fh.write(json.dumps(event, separators=(",", ":"), default=str) + "\n")
            self._fh.flush()
            if durable:
                os.fsync(self._fh.fileno())
        return event

    def close(self) -> None:
        with self._lock:
            self._fh.close()


def read_events(path: Path) -> list[Event]:
    """The events of one file; a torn line (a process killed mid-write) is dropped."""
    events: list[Event] = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                events.append(event)
    return events


def merge(paths: Iterable[Path]) -> list[Event]:
    """All events, ordered by wall clock (one machine: one clock), then by process and line."""
    events = [e for p in paths for e in read_events(p)]
    events.sort(key=lambda e: (e["t"], e["p"], e["n"]))
    return events


def write_merged(events: list[Event], path: Path) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for e in events:
            fh.write(json.dumps(e, separators=(",", ":"), default=str) + "\n")


_REQUIRED = {
    "acquire": ("resource", "token"),
    "invoke": ("id", "resource"),
    "ok": ("id",),
    "fail": ("id",),
    "info": ("id",),
    "committed": ("resource", "seq", "value", "observed", "id"),
    "register": ("resource", "value", "count"),
}


def load_history(path: Path) -> list[Event]:
    """A saved history, strictly: every line one JSON object with ``t`` and ``type`` and the
    fields its type needs. Only a torn last line (a writer killed mid-line) is forgiven."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise HistoryError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise HistoryError(f"{path} is not UTF-8 text (a history is JSON lines)") from exc
    lines = text.splitlines()
    events: list[Event] = []
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except ValueError as exc:
            if no == len(lines) and not text.endswith("\n"):
                break  # torn last line
            raise HistoryError(f"{path}:{no}: not a JSON object: {exc}") from exc
        if not isinstance(event, dict):
            raise HistoryError(f"{path}:{no}: not a JSON object")
        kind = event.get("type")
        if not isinstance(kind, str) or not isinstance(event.get("t"), int | float):
            raise HistoryError(f"{path}:{no}: an event needs a string 'type' and a number 't'")
        missing = [k for k in _REQUIRED.get(kind, ()) if k not in event]
        if missing:
            raise HistoryError(f"{path}:{no}: a {kind!r} event needs {', '.join(missing)}")
        event.setdefault("p", "?")
        event.setdefault("n", no)
        events.append(event)
    if not events:
        raise HistoryError(f"{path}: no events (a history is JSON lines, one event a line)")
    return events
