"""Free TCP ports on loopback, for every server the lab starts (written once).

The ports come from below the kernel's ephemeral range, never from it: every outgoing
connection (a worker to pgbouncer, pgbouncer to PostgreSQL, a client to etcd) takes its local
port from that range, so a server port chosen there can be taken by a client socket while the
server is down, and a server the lab crash-restarts or kills and restarts on its port then
fails to bind it ("Address already in use"). Below the range only servers bind, each port
checked free when chosen.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOOPBACK = "127.0.0.1"

#: The lowest port handed out; below it live well-known and registered services.
_LOWEST = 10_000


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux; 32768 where unknown)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_ports(count: int) -> list[int]:
    """Return ``count`` distinct ports on loopback, free now and below the ephemeral range.

    The sockets are held open together while the ports are picked, so they are distinct;
    another process may still bind one before the server does, which its start reports.
    """
    high = _ephemeral_low()
    if high - _LOWEST < 1_000:  # an unusual range: fall back to the kernel's choice
        candidates: list[int] = [0] * (count * 4)
    else:
        candidates = random.sample(range(_LOWEST, high), min(high - _LOWEST, count * 50))
    socks: list[socket.socket] = []
    try:
        for port in candidates:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((LOOPBACK, port))
            except OSError:
                s.close()
                continue
            socks.append(s)
            if len(socks) == count:
                return [int(s.getsockname()[1]) for s in socks]
        raise OSError(f"no {count} free loopback ports below {high}")
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]
