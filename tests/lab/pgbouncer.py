"""Debian's pgbouncer in transaction pooling mode, in front of one server the lab started.

Used by the pooling tests (``pgbouncer`` fixture) and by the chaos run (workers connect
through it; the nemesis pauses it with commits in flight, and restarts it while the server is
down). As root it runs as the user that owns the target's socket directory, else ``postgres``.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import psycopg

from fencekit.embedded import EmbeddedServer
from tests.lab.ports import LOOPBACK, free_port
from tests.lab.postgres import ServerUnavailable, _as_user_prefix, _chown_tree, _wait_connectable


def pgbouncer_binary() -> str | None:
    return shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
    )


class PgBouncer:
    """A pgbouncer (transaction pooling) in front of one PostgreSQL server; restartable on the
    same port.

    Every database of the target server is reachable through it (``* =`` wildcard). Only users in
    its auth file may log in (clients are trusted): the target's superuser from the start,
    ``users`` (name -> the password pgbouncer logs into the server with), and
    ``allow_user(name)`` adds more and reloads.
    """

    def __init__(
        self,
        target: EmbeddedServer,
        *,
        pool_size: int = 5,
        users: dict[str, str] | None = None,
        settings: dict[str, str] | None = None,
    ) -> None:
        binary = pgbouncer_binary()
        if binary is None:
            raise ServerUnavailable("pgbouncer is not installed: apt-get install pgbouncer")
        self.binary = binary
        self.host = LOOPBACK
        self.port = free_port()
        self.user = target.user
        # pgbouncer refuses to run as root: run it as the user that owns the target's socket
        # dir (pgserver keeps its socket inside its 0700 data dir), else as 'postgres'.
        self._os_user = pwd.getpwuid(os.geteuid()).pw_name
        if os.geteuid() == 0:
            self._os_user = "postgres"
            if target.host.startswith("/"):
                self._os_user = pwd.getpwuid(Path(target.host).stat().st_uid).pw_name
        self.workdir = Path(tempfile.mkdtemp(prefix="fencekit-pgbouncer-"))
        os.chmod(self.workdir, 0o755)
        conf = {
            "listen_addr": LOOPBACK,
            "listen_port": str(self.port),
            "unix_socket_dir": str(self.workdir),
            "auth_type": "trust",
            "auth_file": str(self.workdir / "users.txt"),
            "admin_users": target.user,
            "pool_mode": "transaction",
            "default_pool_size": str(pool_size),
            "max_client_conn": "200",
            "server_reset_query": "",
            "ignore_startup_parameters": "extra_float_digits,options",
            "logfile": str(self.workdir / "pgbouncer.log"),
            **(settings or {}),
        }
        (self.workdir / "pgbouncer.ini").write_text(
            # No user= here: each client logs in to the server as itself (roles stay distinct).
            f"[databases]\n* = host={target.host} port={target.port}\n[pgbouncer]\n"
            + "".join(f"{k} = {v}\n" for k, v in conf.items())
        )
        self._users: dict[str, str] = {target.user: "", **(users or {})}
        self._write_auth()
        _chown_tree(self.workdir, self._os_user)
        self.proc: subprocess.Popen[bytes] | None = None

    def dsn_for(self, dbname: str, user: str | None = None) -> str:
        who = quote(self.user if user is None else user, safe="")
        return f"postgresql://{who}@{LOOPBACK}:{self.port}/{quote(dbname, safe='')}"

    @property
    def dsn(self) -> str:
        return self.dsn_for("postgres")

    def _write_auth(self) -> None:
        path = self.workdir / "users.txt"
        path.write_text("".join(f'"{u}" "{p}"\n' for u, p in sorted(self._users.items())))
        os.chmod(path, 0o600)
        _chown_tree(self.workdir, self._os_user)

    def allow_user(self, name: str, password: str = "") -> None:
        if name in self._users:
            return
        self._users[name] = password
        self._write_auth()
        with psycopg.connect(self.dsn_for("pgbouncer"), autocommit=True) as admin:
            admin.execute("RELOAD")

    def start(self, *, wait_dsn: str | None = None) -> None:
        """Start (again) on the same port; waits for the listening socket, and for a real
        connection through it when ``wait_dsn`` is given (the server may be down on purpose)."""
        self.proc = subprocess.Popen(
            [*_as_user_prefix(self._os_user), self.binary, str(self.workdir / "pgbouncer.ini")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, self.port)):
                break
            time.sleep(0.05)
        else:
            raise ServerUnavailable("pgbouncer did not listen within 20s")
        if wait_dsn is not None:
            _wait_connectable(wait_dsn, 20, "pgbouncer", self.workdir / "pgbouncer.log")

    def pause(self) -> bool:
        """SIGSTOP pgbouncer (its whole process group: runuser and pgbouncer): every
        connection through it hangs, commits in flight included. False when not running."""
        if self.proc is None or self.proc.poll() is not None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGSTOP)
        return True

    def resume(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGCONT)

    def halt(self) -> None:
        """Stop the process (immediate shutdown); :meth:`start` brings it back."""
        self.resume()
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)  # SIGINT: immediate shutdown
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def stop(self) -> None:
        """Stop and remove everything. Idempotent."""
        self.halt()
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_pgbouncer(target: EmbeddedServer, *, pool_size: int = 5) -> PgBouncer:
    bouncer = PgBouncer(target, pool_size=pool_size)
    try:
        bouncer.start(wait_dsn=bouncer.dsn)
    except Exception:
        bouncer.stop()
        raise
    return bouncer
