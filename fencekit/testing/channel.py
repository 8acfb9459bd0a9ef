"""The worker side of the testing kit: named checkpoints and what the worker reports.

``checkpoint("computing")`` marks a point in a worker's code where a test may want to pause it
(after the lease was taken, before the write). Outside a test it does nothing: the kit sets
``FENCEKIT_TESTING_CHANNEL`` (a unix socket path) in the environment of the workers it starts,
and without it the first call notes that there is no channel and every call after returns at
once (one global read).

Under the kit, the worker process connects once to its test's socket and:

- sends each checkpoint it reaches and waits for the test's answer (the test holds it there
  when it asked to pause the worker at that checkpoint, else answers at once);
- forwards every client-side metric event (:mod:`fencekit.metrics`: rejections with their
  token and fence, unfenced writes) as it happens, and the totals when the process exits.

This module imports no test framework: a worker imports it in production code.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import socket
import threading
from typing import Any

__all__ = ["CHANNEL_ENV", "WORKER_ENV", "checkpoint", "report"]

#: Set by the kit in a worker's environment: the unix socket its checkpoints go to.
CHANNEL_ENV = "FENCEKIT_TESTING_CHANNEL"
#: Set by the kit: the worker's name (``a``, ``b``, ``w3``), also its ``application_name``.
WORKER_ENV = "FENCEKIT_TESTING_WORKER"


class _Channel:
    """One connection to the test, shared by the threads of the worker process."""

    def __init__(self, path: str) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(path)
        self._file = self._sock.makefile("rwb", buffering=0)
        self._lock = threading.Lock()

    def send(self, message: dict[str, Any], *, answer: bool = False) -> str | None:
        line = json.dumps(message, default=str).encode() + b"\n"
        with self._lock:
            self._file.write(line)
            if not answer:
                return None
            reply = self._file.readline()
        return reply.decode().strip()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()


_OFF = object()
_channel: Any = None  # None: not looked up yet; _OFF: no kit; else the _Channel
_lookup_lock = threading.Lock()


def _connect() -> _Channel | None:
    global _channel
    with _lookup_lock:
        if _channel is None:
            path = os.environ.get(CHANNEL_ENV)
            _channel = _OFF if not path else _start(path)
    return None if _channel is _OFF else _channel


def _start(path: str) -> _Channel | object:
    try:
        ch = _Channel(path)
    except OSError:
        return _OFF  # the test is gone: behave as in production
    from fencekit import metrics

    def forward(event: metrics.MetricEvent) -> None:
        err = event.error
        ch.send(
            {
                "type": "metric",
                "kind": event.kind,
                "table": event.table,
                "reason": event.reason,
                "sqlstate": event.sqlstate,
                "token": None if err is None else err.token,
                "fence": None if err is None else err.fence,
                "key": None if err is None else err.key,
                "lateness": event.lateness,
                "message": None if err is None else err.message,
            }
        )

    metrics.add_listener(forward)

    def totals() -> None:
        counts = [[k, t, r, n] for (k, t, r), n in metrics.counts().items()]
        with contextlib.suppress(OSError):
            ch.send({"type": "metrics", "counts": counts})
        ch.close()

    atexit.register(totals)
    return ch


def checkpoint(name: str) -> None:
    """Mark a point a test may pause this worker at; a no-op outside the testing kit.

    Under the kit the call reports ``name`` to the test and returns when the test lets the
    worker go on (at once, unless the test holds the worker at this checkpoint).
    """
    if _channel is _OFF:
        return
    ch = _connect()
    if ch is None:
        return
    with contextlib.suppress(OSError):
        ch.send({"type": "checkpoint", "name": str(name), "pid": os.getpid()}, answer=True)


def report(kind: str, **data: Any) -> None:
    """Send the test any JSON-able fact (the bootstrap's outcome); a no-op outside the kit."""
    ch = _connect()
    if ch is not None:
        with contextlib.suppress(OSError):
            ch.send({"type": kind, **data})
