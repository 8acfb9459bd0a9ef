"""``fencekit dev-server``: a local PostgreSQL for developing and testing your own application."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

DESCRIPTION = """\
Start a local PostgreSQL for your own application, print its connection string, and keep it
running until Ctrl-C (or SIGTERM), which stops it again.

The server is the embedded one (the 'embedded' extra: pip install 'pg-fencekit[embedded]'). It
works as root too (it then runs as the system user 'pgserver'). It listens on a unix socket in
its data directory and, with --port, also on 127.0.0.1:PORT. It trusts every local connection:
it is for development and tests, never for data you want to keep.

The data directory (--data-dir, default: a directory per user under the system temp dir) is
kept when the server stops, so the next start has your databases again; --stop --delete
removes it. With --dbname the database is created when it does not exist.

Standard output is the connection string alone (a libpq URI; psycopg, psql, fencekit --dsn,
SQLAlchemy and alembic take it as it is), so a script can capture it; what to do with it goes
to standard error. Examples:

  fencekit dev-server --dbname billing          # foreground; Ctrl-C stops it
  export FENCEKIT_DSN=$(fencekit dev-server --dbname billing --detach)
  fencekit dev-server --stop                    # stop a detached server
"""


def default_data_dir() -> Path:
    """``<tempdir>/fencekit-dev-server-<uid>``: per user, and under the temp dir, because as
    root pgserver makes every parent of the data directory traversable by its system user."""
    return Path(tempfile.gettempdir()) / f"fencekit-dev-server-{os.getuid()}"


def register(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "dev-server",
        help="start a local PostgreSQL for your application, print its DSN; Ctrl-C stops it",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help=f"where the cluster lives, kept between runs (default: {default_data_dir()})",
    )
    p.add_argument(
        "--port",
        type=int,
        default=None,
        help="also listen on TCP 127.0.0.1:PORT (default: the unix socket only)",
    )
    p.add_argument(
        "--dbname",
        default="postgres",
        help="the database the printed DSN names; created if missing (default: %(default)s)",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--detach",
        action="store_true",
        help="start the server, print the DSN and return, leaving it running (stop it with --stop)",
    )
    mode.add_argument(
        "--stop",
        action="store_true",
        help="stop the server running in the data directory and return",
    )
    p.add_argument(
        "--delete",
        action="store_true",
        help="with --stop: also remove the data directory (every database in it)",
    )
    p.set_defaults(func=run, prog=p.prog)
    return p


def run(args: argparse.Namespace) -> int:
    from fencekit.embedded import start_embedded, stop_embedded
    from fencekit.errors import EmbeddedServerError, UsageError

    datadir: Path = (args.data_dir or default_data_dir()).expanduser().resolve()
    if args.delete and not args.stop:
        raise UsageError("--delete goes with --stop")
    if args.port is not None and not 1 <= args.port <= 65535:
        raise UsageError(f"--port {args.port} is not a TCP port (1-65535)")

    if args.stop:
        stopped = stop_embedded(datadir)
        print(
            f"fencekit dev-server: {'stopped' if stopped else 'no server was running in'} "
            f"{datadir}",
            file=sys.stderr,
        )
        if args.delete and datadir.exists():
            import shutil

            shutil.rmtree(datadir)
            print(f"fencekit dev-server: removed {datadir}", file=sys.stderr)
        return 0

    # Handlers first: a Ctrl-C while the server starts stops it once it is up, rather than
    # leaving it running behind an interrupted command.
    stop_requested = None if args.detach else _stop_on_signal()
    try:
        server = start_embedded(datadir, port=args.port)
    except EmbeddedServerError as exc:
        print(f"{args.prog}: error: {exc}", file=sys.stderr)
        return 1
    try:
        _create_database(server.dsn, args.dbname)
        dsn = _dsn(server, args.dbname, args.port)
    except BaseException:
        if not args.detach:
            server.stop()
        raise
    print(dsn, flush=True)
    print(
        f"fencekit dev-server: PostgreSQL {server.server_version} running, data in {datadir}\n"
        f"  use it:   export FENCEKIT_DSN='{dsn}'\n"
        f"  SQLAlchemy / alembic URL: {dsn.replace('postgresql://', 'postgresql+psycopg://', 1)}",
        file=sys.stderr,
        flush=True,
    )
    if args.detach:
        print(
            "  stop it:  fencekit dev-server --stop"
            + ("" if args.data_dir is None else f" --data-dir {datadir}"),
            file=sys.stderr,
        )
        return 0
    print("  stop it:  Ctrl-C", file=sys.stderr, flush=True)
    assert stop_requested is not None
    while not stop_requested.wait(1.0):
        pass
    server.stop()
    print(f"fencekit dev-server: stopped; data kept in {datadir}", file=sys.stderr)
    return 0


def _dsn(server: Any, dbname: str, port: int | None) -> str:
    if port is None:
        return str(server.dsn_for(dbname))
    from urllib.parse import quote

    return f"postgresql://{quote(server.user, safe='')}@127.0.0.1:{port}/{quote(dbname, safe='')}"


def _create_database(dsn: str, dbname: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,)).fetchone()
        if exists is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))


def _stop_on_signal() -> threading.Event:
    """An event set by SIGINT (Ctrl-C), SIGTERM or SIGHUP, which no longer interrupt."""
    done = threading.Event()

    def _handler(signum: int, frame: Any) -> None:
        done.set()

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _handler)
    return done
