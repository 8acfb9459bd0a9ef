"""Servers the chaos run controls: a PostgreSQL it can crash and restart, and a pgbouncer.

A crash-restart needs a server whose data directory and ``pg_ctl`` we own, so the chaos run
starts its own throwaway cluster from the system's PostgreSQL binaries (Debian's
``/usr/lib/postgresql/<v>/bin``, or ``FENCEKIT_PG_BINDIR``) in a temp dir, listening on a free
loopback port, with durable commits (``fsync``, ``synchronous_commit`` on): the run checks that
no acknowledged write is lost across an immediate shutdown, which a server with durability off
would not honour. As root, PostgreSQL and pgbouncer refuse to run, so they run as the
``postgres`` system user through ``runuser``.
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

from fencekit.errors import FencekitError

__all__ = ["Bouncer", "ControlledServer", "ServerError", "find_bindir", "free_port"]

_VERSIONS = (15, 16, 17, 14, 13)  # 15 first: the version the project's CI installs


class ServerError(FencekitError, RuntimeError):
    """A server could not be found, started or stopped."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def find_bindir() -> Path | None:
    """A directory holding ``initdb`` and ``pg_ctl``: ``FENCEKIT_PG_BINDIR`` or Debian's."""
    env = os.environ.get("FENCEKIT_PG_BINDIR")
    candidates = [Path(env)] if env else []
    candidates += [Path(f"/usr/lib/postgresql/{v}/bin") for v in _VERSIONS]
    for c in candidates:
        if (c / "pg_ctl").exists() and (c / "initdb").exists():
            return c
    return None


def _os_user() -> str:
    return "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name


def _prefix(user: str) -> list[str]:
    return ["runuser", "-u", user, "--"] if os.geteuid() == 0 else []


def _chown_tree(path: Path, user: str) -> None:
    if os.geteuid() != 0:
        return
    pw = pwd.getpwnam(user)
    for root, dirs, files in os.walk(path):
        os.chown(root, pw.pw_uid, pw.pw_gid)
        for name in dirs + files:
            os.chown(os.path.join(root, name), pw.pw_uid, pw.pw_gid)


def wait_connectable(dsn: str, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with psycopg.connect(dsn, connect_timeout=2, autocommit=True) as conn:
                conn.execute("SELECT 1")
            return
        except psycopg.OperationalError as exc:
            last = exc
            time.sleep(0.1)
    raise ServerError(f"{what} did not accept connections within {timeout:g}s: {last}")


class ControlledServer:
    """A throwaway PostgreSQL cluster on 127.0.0.1 that can be crashed and started again."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.user = "postgres"
        self.host = "127.0.0.1"
        self.port = free_port()
        self._os_user = _os_user()
        self.tmp = Path(tempfile.mkdtemp(prefix="fencekit-chaos-pg-"))
        self.datadir = self.tmp / "data"
        self.log = self.tmp / "server.log"
        self.running = False
        #: extra environment of the server's processes (libfaketime: a faked server clock)
        self.env: dict[str, str] = {}

    @property
    def version(self) -> str:
        return self.bindir.parent.name

    def dsn_for(self, dbname: str) -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{quote(dbname, safe='')}"

    def _run(self, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*_prefix(self._os_user), *args], capture_output=True, text=True, timeout=timeout,
            env={**os.environ, **self.env},
        )  # fmt: skip

    def init(self) -> None:
        self.datadir.mkdir()
        self.log.touch()
        os.chmod(self.tmp, 0o755)
        os.chmod(self.datadir, 0o700)
        _chown_tree(self.tmp, self._os_user)
        proc = self._run(
            str(self.bindir / "initdb"), "-D", str(self.datadir), "-U", self.user,
            "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync",
        )  # fmt: skip
        if proc.returncode != 0:
            raise ServerError(f"initdb failed: {proc.stderr[-2000:]}")
        # Trust on loopback and the private socket dir only; nothing else listens.
        (self.datadir / "pg_hba.conf").write_text(
            "local all all trust\nhost  all all 127.0.0.1/32 trust\n"
        )
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.tmp}'",
            "max_connections": "100",
            # Durable: the checker verifies acknowledged writes survive an immediate shutdown.
            "fsync": "on",
            "synchronous_commit": "on",
            "full_page_writes": "on",
            "shared_buffers": "32MB",
        }
        if self.version.isdigit() and int(self.version) >= 14:
            # One syncfs at crash recovery instead of an fsync of every file: faster restarts.
            settings["recovery_init_sync_method"] = "syncfs"
        with open(self.datadir / "postgresql.auto.conf", "a") as fh:
            fh.writelines(f"{k} = {v}\n" for k, v in settings.items())
        _chown_tree(self.datadir, self._os_user)

    def start(self) -> None:
        proc = self._run(
            str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-l", str(self.log),
            "-o", f"-p {self.port}", "-w", "-t", "60", "start",
        )  # fmt: skip
        if proc.returncode != 0:
            tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise ServerError(f"PostgreSQL did not start: {proc.stderr}\n{tail}")
        self.running = True
        wait_connectable(self.dsn_for("postgres"), 30, "PostgreSQL")

    def crash(self) -> None:
        """Immediate shutdown: no checkpoint; the next start recovers from the WAL."""
        proc = self._run(
            str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m", "immediate", "-w", "stop"
        )
        self.running = False
        if proc.returncode != 0:
            raise ServerError(f"pg_ctl stop -m immediate failed: {proc.stderr}")

    def stop(self) -> None:
        """Stop (fast) and remove the cluster. Idempotent."""
        if self.running:
            self._run(
                str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m", "fast", "-w", "stop"
            )
            self.running = False
        pidfile = self.datadir / "postmaster.pid"
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int(pidfile.read_text().splitlines()[0])
            os.kill(pid, signal.SIGKILL)  # only if fast stop left it behind
        shutil.rmtree(self.tmp, ignore_errors=True)


def bouncer_binary() -> str | None:
    found = shutil.which("pgbouncer")
    if found:
        return found
    return "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None


class Bouncer:
    """pgbouncer (transaction pooling) in front of one server; restartable on the same port."""

    def __init__(
        self, host: str, port: int, user: str, *, users: dict[str, str] | None = None
    ) -> None:
        """``user`` logs in without a password (trust); ``users`` maps more login roles to
        the password pgbouncer logs into the server with (clients are trusted either way)."""
        binary = bouncer_binary()
        if binary is None:
            raise ServerError("--pgbouncer needs pgbouncer: apt-get install pgbouncer")
        self.binary = binary
        self.user = user
        self.port = free_port()
        self._os_user = _os_user()
        if os.geteuid() == 0 and host.startswith("/"):
            self._os_user = pwd.getpwuid(Path(host).stat().st_uid).pw_name
        self.workdir = Path(tempfile.mkdtemp(prefix="fencekit-chaos-bouncer-"))
        os.chmod(self.workdir, 0o755)
        (self.workdir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={host} port={port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            f"unix_socket_dir = {self.workdir}\n"
            "auth_type = trust\n"
            f"auth_file = {self.workdir / 'users.txt'}\n"
            "pool_mode = transaction\n"
            "default_pool_size = 20\n"
            "max_client_conn = 200\n"
            "server_reset_query =\n"
            # Retry the server soon after it comes back (default: 15 s after a failed login),
            # and never queue a client for long while it is down.
            "server_login_retry = 1\n"
            "query_wait_timeout = 5\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {self.workdir / 'pgbouncer.log'}\n"
        )
        logins = {user: "", **(users or {})}
        (self.workdir / "users.txt").write_text(
            "".join(f'"{name}" "{password}"\n' for name, password in logins.items())
        )
        os.chmod(self.workdir / "users.txt", 0o600)
        _chown_tree(self.workdir, self._os_user)
        self.proc: subprocess.Popen[bytes] | None = None

    def dsn_for(self, dbname: str) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{quote(dbname, safe='')}"

    def start(self, *, wait_dsn: str | None = None) -> None:
        self.proc = subprocess.Popen(
            [*_prefix(self._os_user), self.binary, str(self.workdir / "pgbouncer.ini")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        # Wait for the listening socket (the server behind it may be down on purpose).
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                break
            time.sleep(0.05)
        else:
            raise ServerError("pgbouncer did not listen within 20s")
        if wait_dsn is not None:
            wait_connectable(wait_dsn, 20, "pgbouncer")

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

    def stop(self) -> None:
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

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)
