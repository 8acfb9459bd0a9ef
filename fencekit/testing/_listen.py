"""The test side of the kit's channel (channel.py is the worker side): a unix socket that hands
each message a worker sends, one JSON object a line, to a handler with the connection to answer
on. Both the single-worker harness (workers.py) and ``run_many`` (many.py) listen this way."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["listen"]

#: A handler: the message, and the worker's connection (``write(b"go\n")`` answers it).
Handler = Callable[[dict[str, Any], Any], None]


def listen(path: str, backlog: int, name: str, handle: Handler) -> socket.socket:
    """Listen on ``path`` in a daemon thread named ``name``; close the returned socket to
    stop accepting."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(backlog)
    threading.Thread(target=_accept, args=(server, handle), daemon=True, name=name).start()
    return server


def _accept(server: socket.socket, handle: Handler) -> None:
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        threading.Thread(target=_serve, args=(conn, handle), daemon=True).start()


def _serve(conn: socket.socket, handle: Handler) -> None:
    f = conn.makefile("rwb", buffering=0)
    with contextlib.suppress(OSError, ValueError):
        for line in f:
            handle(json.loads(line), f)
    with contextlib.suppress(OSError):
        conn.close()
