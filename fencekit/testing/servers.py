"""Which PostgreSQL the kit's databases live on: pytest-postgresql's or the embedded one.

- ``proc``: pytest-postgresql's ``postgresql_proc`` starts a server from the PostgreSQL
  installed on the machine (its ``postgresql_exec`` setting names ``pg_ctl``). PostgreSQL refuses
  to run as root: as root, use ``dsn``/``noproc`` or the embedded server.
- ``noproc``: pytest-postgresql's ``postgresql_noproc``, a server that already runs (a CI
  service), configured by its ``postgresql_host``/``_port``/``_user``/``_password`` settings.
- ``dsn``: a server given by one connection string (``--fencekit-dsn``, the ``fencekit_dsn`` ini
  option, or ``FENCEKIT_TEST_DSN``), wrapped as pytest-postgresql's ``NoopExecutor``.
- ``embedded``: fencekit's throwaway server from the ``pgserver`` package
  (``pip install 'pg-fencekit[embedded]'``), started once per session.
- ``auto`` (the default): ``dsn`` when one is given, else ``proc`` when ``pg_ctl`` is there and
  we are not root, else ``embedded``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from psycopg.conninfo import conninfo_to_dict

__all__ = ["CHOICES", "DSN_ENV", "Server", "choose", "from_dsn", "from_executor"]

DSN_ENV = "FENCEKIT_TEST_DSN"
CHOICES = ("auto", "proc", "noproc", "dsn", "embedded")


@dataclass
class Server:
    """Where to connect as the superuser who creates the test databases."""

    kind: str
    host: str
    port: int
    user: str
    password: str | None = None
    options: str = ""
    maintenance_dbname: str = "postgres"

    def dsn_for(self, dbname: str, user: str | None = None, password: str | None = None) -> str:
        """A libpq URI for ``dbname`` as ``user`` (default: the superuser)."""
        who = self.user if user is None else user
        secret = self.password if user is None else password
        auth = quote(who, safe="") + (":" + quote(secret, safe="") if secret else "")
        params = f"host={quote(self.host, safe='')}&port={self.port}"
        if self.options:
            params += f"&options={quote(self.options, safe='')}"
        return f"postgresql://{auth}@/{quote(dbname, safe='')}?{params}"

    def url_for(self, dbname: str, user: str | None = None, password: str | None = None) -> str:
        """The same as a SQLAlchemy URL (``postgresql+psycopg``)."""
        return "postgresql+psycopg" + self.dsn_for(dbname, user, password)[len("postgresql") :]


def from_executor(kind: str, executor: Any) -> Server:
    """pytest-postgresql's ``PostgreSQLExecutor`` / ``NoopExecutor`` as a :class:`Server`."""
    return Server(
        kind=kind,
        host=str(executor.host),
        port=int(executor.port),
        user=str(executor.user),
        password=executor.password or None,
        options=str(getattr(executor, "options", "") or ""),
        maintenance_dbname=str(getattr(executor, "maintenance_dbname", "postgres") or "postgres"),
    )


def from_dsn(dsn: str) -> Server:
    p = conninfo_to_dict(dsn)
    return Server(
        kind="dsn",
        host=str(p.get("host") or os.environ.get("PGHOST") or "localhost"),
        port=int(p.get("port") or os.environ.get("PGPORT") or 5432),
        user=str(p.get("user") or os.environ.get("PGUSER") or "postgres"),
        password=str(p.get("password") or os.environ.get("PGPASSWORD") or "") or None,
        options=str(p.get("options") or ""),
        maintenance_dbname=str(p.get("dbname") or "postgres"),
    )


def choose(wanted: str, *, dsn: str | None, pg_ctl: str | None) -> str:
    """The server kind to use for ``wanted`` (one of :data:`CHOICES`)."""
    if wanted not in CHOICES:
        raise ValueError(f"fencekit_server must be one of {', '.join(CHOICES)}, not {wanted!r}")
    if wanted != "auto":
        return wanted
    if dsn:
        return "dsn"
    if pg_ctl and Path(pg_ctl).exists() and os.geteuid() != 0:
        return "proc"
    return "embedded"
