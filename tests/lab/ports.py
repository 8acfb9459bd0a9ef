"""Free TCP ports on loopback, for every server the lab starts (written once)."""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def free_ports(count: int) -> list[int]:
    """Return ``count`` distinct currently-free TCP ports on loopback.

    The sockets are held open together while the kernel picks, so the ports are distinct;
    another process may still grab one before the server binds it, which its start reports.
    """
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOOPBACK, 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]
