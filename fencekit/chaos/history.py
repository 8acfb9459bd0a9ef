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
- ``pause`` / ``resume`` / ``kill`` / ``spawn`` / ``crash`` / ``restart`` / ``bouncer``: the
  nemesis
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

__all__ = ["Event", "HistoryWriter", "merge", "read_events", "write_merged"]

Event = dict[str, Any]


class HistoryWriter:
    """Append events to one JSON-lines file, each one durable before ``append`` returns."""

    def __init__(self, path: Path, process: str) -> None:
        self.path = path
        self.process = process
        self._fh: TextIO = open(path, "a", encoding="utf-8")  # noqa: SIM115  # closed in close()
        self._n = 0

    def append(self, type_: str, **data: Any) -> Event:
        self._n += 1
        event: Event = {"t": time.time(), "p": self.process, "n": self._n, "type": type_, **data}
        self._fh.write(json.dumps(event, separators=(",", ":"), default=str) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        return event

    def close(self) -> None:
        self._fh.close()


def read_events(path: Path) -> list[Event]:
    """The events of one file; a torn last line (a process killed mid-write) is dropped."""
    events: list[Event] = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
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
