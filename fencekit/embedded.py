"""A throwaway PostgreSQL server for the demo and the test suite.

``start_embedded()`` runs a private PostgreSQL from the binaries that the ``pgserver`` package
ships (install the ``embedded`` extra: ``pip install 'pg-fencekit[embedded]'``). The server
listens only on a unix socket inside its own data directory, so several servers can run side by
side without port clashes, and it uses trust authentication: it is for demos and tests, never for
data you want to keep.

    with start_embedded() as server:
        with psycopg.connect(server.dsn) as conn:
            ...

Running as root: PostgreSQL refuses to run as root, so pgserver creates a system user
``pgserver`` (with ``useradd``), hands it the data directory, and makes every parent directory of
the data directory and of its own binaries traversable by others (``chmod go+rx``). The default
data directory lives under the system temp dir, so only that temp dir's subdirectory is touched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

from fencekit.errors import EmbeddedServerError

__all__ = ["EmbeddedServer", "EmbeddedServerError", "start_embedded", "stop_embedded"]


class EmbeddedServer:
    """A running throwaway PostgreSQL server.

    ``dsn`` is a libpq URI for the ``postgres`` database as superuser ``user``; ``host`` is a unix
    socket directory or a TCP address; ``datadir`` is None for a server we did not start.
    ``stop()`` shuts the server down and removes what it created; it is idempotent and also runs
    when the ``with`` block ends.
    """

    def __init__(
        self,
        *,
        host: str,
        port: int,
        user: str,
        datadir: Path | None,
        stop: Callable[[], None],
        dbname: str = "postgres",
        password: str | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.user = user
        self.password = password
        self.dbname = dbname
        self.datadir = datadir
        self._stop = stop
        self._stopped = False
        self._version: str | None = None
        self._version_num: int | None = None

    def dsn_for(self, dbname: str, user: str | None = None) -> str:
        """A libpq URI for another database (and optionally role) on this server."""
        auth = quote(self.user if user is None else user, safe="")
        if user is None and self.password:
            auth += ":" + quote(self.password, safe="")
        host = quote(self.host, safe="")
        return f"postgresql://{auth}@/{quote(dbname, safe='')}?host={host}&port={self.port}"

    @property
    def dsn(self) -> str:
        """A libpq URI for the ``postgres`` database as superuser, usable by psycopg 3."""
        return self.dsn_for(self.dbname)

    def _fetch_version(self) -> None:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT current_setting('server_version'), "
                "current_setting('server_version_num')::int"
            ).fetchone()
        assert row is not None
        self._version, self._version_num = str(row[0]), int(row[1])

    @property
    def server_version(self) -> str:
        """The server's version string, e.g. ``'16.2'``."""
        if self._version is None:
            self._fetch_version()
        assert self._version is not None
        return self._version

    @property
    def server_version_num(self) -> int:
        """The server's version as an integer, e.g. ``160002``."""
        if self._version_num is None:
            self._fetch_version()
        assert self._version_num is not None
        return self._version_num

    @property
    def stopped(self) -> bool:
        return self._stopped

    def stop(self) -> None:
        """Stop the server and remove its data directory. Safe to call more than once."""
        if self._stopped:
            return
        self._stopped = True
        self._stop()

    def __enter__(self) -> EmbeddedServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else "running"
        return (
            f"<EmbeddedServer {state} host={self.host!r} port={self.port} datadir={self.datadir}>"
        )


def _import_pgserver() -> Any:
    try:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (typical for root, CI, containers).
            warnings.simplefilter("ignore")
            import pgserver
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise EmbeddedServerError(
            "the embedded PostgreSQL needs the 'pgserver' package: "
            "pip install 'pg-fencekit[embedded]' (or pass a DSN to your own server instead)"
        ) from exc
    return pgserver


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` still runs. A zombie does not: the postmaster is not our child (pg_ctl
    daemonises it), so init reaps it, and some inits (a container's, a microVM's) reap only
    every few seconds, while signal 0 still reaches the zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    except (OSError, IndexError):  # no /proc: ask the kernel whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # exists, owned by someone else
            return True
        return True
    return fields[0] != "Z"


def _wait_gone(pid: int, timeout: float) -> bool:
    """Wait until ``pid`` (not our child: pg_ctl daemonises the postmaster) has exited."""
    deadline = time.monotonic() + timeout
    while _pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def start_embedded(datadir: Path | None = None, *, port: int | None = None) -> EmbeddedServer:
    """Start a throwaway PostgreSQL server and return a handle to it.

    With no ``datadir`` a fresh temporary directory is used and removed on ``stop()``. With a
    ``datadir`` the data is kept on ``stop()`` (the server is only stopped), and an existing
    cluster in it is reused (a server already running there is used as it is). Independent
    servers may run concurrently as long as their data directories differ: each listens only on
    a unix socket in its own directory, and with ``port`` also on TCP ``127.0.0.1:port`` (trust
    authentication: anyone on this machine may connect as its superuser).
    """
    for attempt in range(3):
        try:
            return _start_embedded(datadir, port)
        except EmbeddedServerError:
            # The first start on a fresh machine can lose a race inside pgserver (as root it
            # creates its system user and chowns the data directory; initdb then failed once
            # with "could not change permissions ... Operation not permitted"). A fresh
            # directory starts cleanly; a server that cannot start at all fails three times.
            if attempt == 2 or datadir is not None:
                raise
    raise AssertionError("unreachable")


def _listen_on(pg: Any, pgdata: Path, port: int) -> Any:
    """Restart the server ``pg`` (pgserver's, unix socket only) listening on 127.0.0.1:port
    too, with its socket where it was; returns the new postmaster info."""
    from pgserver import _commands
    from pgserver.utils import PostmasterInfo

    info = pg.get_postmaster_info()
    if info.port == port and info.hostname == "127.0.0.1":
        return info  # already listening there (a server left running with this port)
    try:
        _commands.pg_ctl(  # type: ignore[attr-defined]  # generated at import time
            ["-w", "-m", "fast", "stop"], pgdata=pgdata, user=pg.system_user, timeout=60
        )
        _commands.pg_ctl(  # type: ignore[attr-defined]
            [
                "-w",
                "-o",
                f"-h 127.0.0.1 -p {int(port)} -k {info.socket_dir}",
                "-l",
                str(pgdata / "log"),
                "start",
            ],
            pgdata=pgdata,
            user=pg.system_user,
            timeout=60,
        )
    except Exception as exc:
        log = pgdata / "log"
        detail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no server log)"
        raise EmbeddedServerError(
            f"could not start the embedded PostgreSQL on 127.0.0.1:{port} (is the port in "
            f"use?): {exc}\n{detail}"
        ) from exc
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        new = PostmasterInfo.read_from_pgdata(pgdata)
        if new is not None and new.is_running() and new.status == "ready":
            return new
        time.sleep(0.1)
    raise EmbeddedServerError(f"the embedded PostgreSQL in {pgdata} did not become ready")


def stop_embedded(datadir: Path) -> bool:
    """Stop the embedded server running in ``datadir`` (started by another process, e.g.
    ``fencekit dev-server --detach``); keeps the data. False when none was running there."""
    pgdata = Path(datadir).expanduser().resolve()
    pid_file = pgdata / "postmaster.pid"
    if not pid_file.exists():
        return False
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return False
    if not _pid_alive(pid):
        return False
    _import_pgserver()
    from pgserver import _commands

    # As root pgserver runs the server as its system user 'pgserver'; pg_ctl must run as the
    # data directory's owner.
    user = "pgserver" if os.geteuid() == 0 else None
    with contextlib.suppress(Exception):
        _commands.pg_ctl(  # type: ignore[attr-defined]
            ["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user, timeout=60
        )
    if not _wait_gone(pid, 30):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        if not _wait_gone(pid, 10):
            raise EmbeddedServerError(f"embedded PostgreSQL (pid {pid}) did not stop")
    return True


def _start_embedded(datadir: Path | None, port: int | None = None) -> EmbeddedServer:
    pgserver = _import_pgserver()

    owned_tmp: Path | None = None
    if datadir is None:
        owned_tmp = Path(tempfile.mkdtemp(prefix="fencekit-pg-"))
        pgdata = owned_tmp / "data"
    else:
        pgdata = Path(datadir).expanduser().resolve()
        pgdata.parent.mkdir(parents=True, exist_ok=True)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # cleanup_mode=None: we stop (and delete) ourselves, and check that it worked.
            pg = pgserver.get_server(pgdata, cleanup_mode=None)
        info = pg.get_postmaster_info()
        if port is not None:
            info = _listen_on(pg, pgdata, port)
    except EmbeddedServerError:
        if owned_tmp is not None:
            shutil.rmtree(owned_tmp, ignore_errors=True)
        raise
    except Exception as exc:
        log = pgdata / "log"
        detail = log.read_text(errors="replace")[-4000:] if log.exists() else "(no server log)"
        if owned_tmp is not None:
            shutil.rmtree(owned_tmp, ignore_errors=True)
        raise EmbeddedServerError(
            f"could not start the embedded PostgreSQL in {pgdata}: {exc}\n{detail}"
        ) from exc

    pid = int(info.pid)
    socket_dir = str(info.socket_dir)
    port = int(info.port or 5432)

    def _stop() -> None:
        from pgserver import _commands  # pgserver's wrappers around its own binaries

        # A failed pg_ctl stop falls through to the pid check and a kill.
        with contextlib.suppress(Exception):
            _commands.pg_ctl(  # type: ignore[attr-defined]  # generated at import time
                ["-w", "-m", "fast", "stop"],
                pgdata=pgdata,
                user=pg.system_user,
                timeout=60,
            )
        if not _wait_gone(pid, 30):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            if not _wait_gone(pid, 10):
                raise EmbeddedServerError(f"embedded PostgreSQL (pid {pid}) did not stop")
        # pgserver keeps a per-process registry and an atexit hook; drop both.
        with contextlib.suppress(Exception):
            pgserver.PostgresServer._instances.pop(pgdata, None)
        with contextlib.suppress(Exception):
            import atexit

            atexit.unregister(pg._cleanup)
        if owned_tmp is not None:
            for _ in range(5):
                shutil.rmtree(owned_tmp, ignore_errors=True)
                if not owned_tmp.exists():
                    break
                time.sleep(0.2)
        # If pgserver fell back to a socket dir outside pgdata (long paths), remove it too.
        sock = Path(socket_dir)
        if sock != pgdata and sock.exists():
            shutil.rmtree(sock, ignore_errors=True)

    return EmbeddedServer(
        host=socket_dir,
        port=port,
        user=str(pg.postgres_user),
        datadir=pgdata,
        stop=_stop,
    )
