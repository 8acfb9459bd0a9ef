"""The fenced database: a template built once, cloned per test (or per session).

The template gets, in this order: fencekit's core, your schema (an alembic head, an SQL file or
a callable), your fences (specs, or the fences declared on a SQLAlchemy ``MetaData``; tables an
alembic migration already protected are left as they are), an application role with
``fencekit_writer`` and the privileges of an application (DML on the tables, sequences), and
the opt-in write history (:mod:`fencekit.testing.history`). Databases are created from it with
pytest-postgresql's ``DatabaseJanitor``, as its own fixtures do, and dropped afterwards.

Roles are cluster-wide: fencekit's own (``fencekit_admin``, ``fencekit_writer``) and the
application role may exist already (another session, an earlier run, a CI service's setup).
They are used as they are, and only a role this session created is dropped at its end.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from fencekit.errors import SetupError
from fencekit.spec import FenceSpec, TableName
from fencekit.testing import history
from fencekit.testing.servers import Server

if TYPE_CHECKING:
    from fencekit.testing.workers import Worker

__all__ = ["DatabaseSetup", "FencedDatabase", "SchemaSource", "Template", "build_template"]

#: ``fn(dsn)``: puts the schema into the database at ``dsn`` (superuser).
SchemaSource = str | os.PathLike[str] | Callable[[str], None] | None

DEFAULT_APP_ROLE = "fencekit_test_app"
DEFAULT_GRANTS = (
    "SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public",
    "USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public",
)


@dataclass(frozen=True)
class DatabaseSetup:
    """What goes into the template; see :func:`pytest_fencekit.fenced_database`."""

    schema: SchemaSource = None
    fences: Any = ()  # FenceSpec objects, or a SQLAlchemy MetaData with declared fences
    app_role: str = DEFAULT_APP_ROLE
    grants: Sequence[str] = DEFAULT_GRANTS
    history: bool = True
    alembic_revision: str = "head"

    def fingerprint(self) -> str:
        """A short stable name for this setup, so two setups get two templates."""
        raw = json.dumps(
            [
                _schema_label(self.schema),
                [s.as_dict() for s in _fence_specs(self.fences)],
                self.app_role, list(self.grants), self.history, self.alembic_revision,
            ],
            sort_keys=True, default=str,
        )  # fmt: skip
        return hashlib.sha256(raw.encode()).hexdigest()[:10]


def _schema_label(schema: SchemaSource) -> str:
    if schema is None:
        return ""
    if callable(schema):
        return f"{getattr(schema, '__module__', '?')}:{getattr(schema, '__qualname__', schema)}"
    return str(schema)


def _fence_specs(fences: Any) -> list[FenceSpec]:
    if fences is None:
        return []
    if hasattr(fences, "tables") and hasattr(fences, "sorted_tables"):  # a MetaData
        from fencekit.declare import declared_fences

        return [spec for _, spec in declared_fences(fences)]
    specs = list(fences)
    for s in specs:
        if not isinstance(s, FenceSpec):
            raise TypeError(f"fences= takes FenceSpec objects or a MetaData, not {s!r}")
    return specs


# ---------------------------------------------------------------- building the template


def _run(conn: psycopg.Connection[Any], statements: Iterable[str | sql.Composable]) -> None:
    for statement in statements:
        if isinstance(statement, str):
            conn.execute(statement.encode())  # bytes: no %-placeholder parsing
        else:
            conn.execute(statement.as_string(conn).encode())


def _install_core(dsn: str) -> None:
    from fencekit.sqlgen import render_install

    script = render_install()
    for attempt in range(3):
        with psycopg.connect(dsn) as conn:
            try:
                conn.execute(script.encode())
                conn.commit()
                return
            except psycopg.errors.UniqueViolation:
                # Another session creates fencekit's cluster-wide roles at the same moment:
                # they are there when we try again.
                if attempt == 2:
                    raise


def _load_schema(setup: DatabaseSetup, dsn: str, url: str) -> None:
    schema = setup.schema
    if schema is None:
        return
    if callable(schema):
        schema(dsn)
        return
    text = str(schema)
    if ":" in text and not Path(text).exists() and not text.endswith((".ini", ".sql")):
        from fencekit.testing._bootstrap import resolve

        resolve(text)(dsn)
        return
    path = Path(text)
    if not path.exists():
        raise SetupError(f"schema source {text!r}: no such file (an alembic.ini, a .sql file "
                         "or module:function)")  # fmt: skip
    if path.suffix == ".sql":
        with psycopg.connect(dsn) as conn:
            conn.execute(path.read_bytes())
        return
    _alembic_upgrade(path, url, setup.alembic_revision)


def _alembic_upgrade(ini: Path, url: str, revision: str) -> None:
    try:
        from alembic import command
        from alembic.config import Config
    except ImportError as exc:
        raise SetupError(
            f"schema {ini} is an alembic project: pip install 'pg-fencekit[alembic]'"
        ) from exc
    cfg = Config(str(ini))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    # fencekit's env.py template (and many others) read DATABASE_URL first.
    old = os.environ.get("DATABASE_URL")
    os.environ["DATABASE_URL"] = url
    try:
        command.upgrade(cfg, revision)
    finally:
        if old is None:
            os.environ.pop("DATABASE_URL", None)
        else:
            os.environ["DATABASE_URL"] = old


def _protected(conn: psycopg.Connection[Any]) -> dict[TableName, FenceSpec]:
    rows = conn.execute("SELECT spec FROM fencekit.protected").fetchall()
    specs = [FenceSpec.from_dict(r[0]) for r in rows]
    return {s.table: s for s in specs}


def _ensure_role(server: Server, role: str) -> str:
    """The application role: created (LOGIN, a password of its own) unless it exists.

    Returns its password (empty when the role was already there: it is used as it is).
    """
    password = secrets.token_hex(12)
    with psycopg.connect(server.dsn_for(server.maintenance_dbname), autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
            return ""
        try:
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                    sql.Identifier(role), sql.Literal(password)
                )
            )
        except psycopg.errors.DuplicateObject:
            return ""  # created meanwhile by another session
        return password


@dataclass
class Template:
    """A built template database and what the clones need to know."""

    server: Server
    name: str
    setup: DatabaseSetup
    app_password: str
    specs: list[FenceSpec] = field(default_factory=list)


def build_template(server: Server, setup: DatabaseSetup, name: str) -> Template:
    """Create the template database ``name`` and put everything in it (see the module doc)."""
    from pytest_postgresql.janitor import DatabaseJanitor

    janitor = DatabaseJanitor(
        user=server.user, host=server.host, port=server.port, password=server.password,
        dbname=name, maintenance_dbname=server.maintenance_dbname, as_template=True,
    )  # fmt: skip
    janitor.drop()
    janitor.init()
    dsn = server.dsn_for(name)
    try:
        password = _ensure_role(server, setup.app_role)
        step = "installing fencekit's core"
        _install_core(dsn)
        step = f"loading the schema from {_schema_label(setup.schema)}"
        _load_schema(setup, dsn, server.url_for(name))
        with psycopg.connect(dsn) as conn:
            step = "protecting the fences"
            have = _protected(conn)
            for spec in _fence_specs(setup.fences):
                if spec.table not in have:
                    from fencekit.sqlgen import protect_statements
                    from fencekit.sqlgen.pin import pinned

                    # search_path pinned for them: this transaction, then restored
                    _run(conn, pinned(protect_statements(spec)))
            conn.commit()
            specs = list(_protected(conn).values())
            step = f"granting the application role {setup.app_role}"
            role = sql.Identifier(setup.app_role)
            _run(conn, [
                sql.SQL("GRANT fencekit_writer TO {}").format(role),
                sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(name), role),
                sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(role),
                *(sql.SQL("GRANT {} TO {}").format(sql.SQL(g), role) for g in setup.grants),
            ])  # fmt: skip
            if setup.history:
                step = "installing the write history"
                _run(conn, history.install_statements())
                for spec in specs:
                    _run(conn, history.track_statements(conn, spec))
            conn.commit()
    except Exception as exc:
        janitor.drop()
        if isinstance(exc, SetupError):
            raise
        raise SetupError(f"building the fenced template database failed while {step}: "
                         f"{type(exc).__name__}: {exc}") from exc  # fmt: skip
    return Template(server, name, setup, password, specs)


def drop_template(tpl: Template) -> None:
    from pytest_postgresql.janitor import DatabaseJanitor

    s = tpl.server
    DatabaseJanitor(
        user=s.user, host=s.host, port=s.port, password=s.password, dbname=tpl.name,
        maintenance_dbname=s.maintenance_dbname, as_template=True,
    ).drop()  # fmt: skip


FENCEKIT_ROLES = ("fencekit_writer", "fencekit_admin")  # what the core install creates


def cluster_roles(server: Server) -> set[str]:
    """The roles that exist on the server now."""
    with psycopg.connect(server.dsn_for(server.maintenance_dbname), autocommit=True) as conn:
        return {str(r) for (r,) in conn.execute("SELECT rolname FROM pg_roles")}


def drop_roles(server: Server, roles: Iterable[str]) -> None:
    """Drop the roles this session created (members before the roles they belong to). A role
    still used in another database (another session's) stays: DROP ROLE refuses, we go on."""
    with psycopg.connect(server.dsn_for(server.maintenance_dbname), autocommit=True) as conn:
        for role in roles:
            with contextlib.suppress(psycopg.Error):
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


# ---------------------------------------------------------------- one database


class FencedDatabase:
    """A database cloned from the template: connection strings, workers, what fencekit saw.

    ``dsn``/``url``: the superuser (libpq URI / SQLAlchemy URL); ``app_dsn``/``app_url``: the
    application role, member of ``fencekit_writer``: give those to your workers.
    """

    def __init__(self, tpl: Template, name: str) -> None:
        self.template = tpl
        self.server = tpl.server
        self.name = name
        self.app_role = tpl.setup.app_role
        self.specs = list(tpl.specs)
        self.workers: list[Worker] = []
        self._count = 0

    @property
    def dsn(self) -> str:
        return self.server.dsn_for(self.name)

    @property
    def url(self) -> str:
        return self.server.url_for(self.name)

    @property
    def app_dsn(self) -> str:
        return self.server.dsn_for(self.name, self.app_role, self.template.app_password or None)

    @property
    def app_url(self) -> str:
        return self.server.url_for(self.name, self.app_role, self.template.app_password or None)

    def connect(self, *, app: bool = False, autocommit: bool = True) -> psycopg.Connection[Any]:
        """A psycopg connection as the superuser (``app=True``: as the application role)."""
        return psycopg.connect(self.app_dsn if app else self.dsn, autocommit=autocommit)

    @contextlib.contextmanager
    def _admin(self) -> Iterator[psycopg.Connection[Any]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            yield conn

    # ------------------------------------------------------------ workers

    def _name(self, name: str | None) -> str:
        self._count += 1
        return name or f"w{self._count}"

    def spawn(
        self, fn: Callable[..., Any], *args: Any, name: str | None = None,
        pause_at: str | None = None, **kwargs: Any,
    ) -> Worker:  # fmt: skip
        """Start ``fn(*args, **kwargs)`` as a worker process (see :func:`fencekit.testing.spawn`);
        the database remembers it, prints its output when an assertion fails, and kills it
        at teardown. Its environment gets ``FENCEKIT_TEST_APP_DSN`` (a Django project's
        worker connects there: its ``DATABASES['default']`` points at this database)."""
        from fencekit.testing.workers import spawn

        worker = spawn(
            fn, *args, name=self._name(name), pause_at=pause_at,
            env={"FENCEKIT_TEST_APP_DSN": self.app_dsn, **(kwargs.pop("env", None) or {})},
            **kwargs,
        )  # fmt: skip
        worker.db = self
        self.workers.append(worker)
        return worker

    def spawn_command(
        self, command: Sequence[str], *, name: str | None = None, pause_at: str | None = None,
        env: dict[str, str] | None = None,
    ) -> Worker:  # fmt: skip
        """Start ``command`` as a worker (its environment gets ``FENCEKIT_TEST_APP_DSN``)."""
        from fencekit.testing.workers import spawn_command

        worker = spawn_command(
            command, name=self._name(name), pause_at=pause_at,
            env={"FENCEKIT_TEST_APP_DSN": self.app_dsn, **(env or {})},
        )  # fmt: skip
        worker.db = self
        self.workers.append(worker)
        return worker

    def close(self) -> None:
        for worker in self.workers:
            worker.close()

    # ------------------------------------------------------------ reading fencekit's state

    def spec_of(self, table: str) -> FenceSpec | None:
        name = TableName.parse(table)
        return next((s for s in self.specs if s.table == name), None)

    def rejections(self, table: str) -> dict[str, int]:
        """fencekit's counters of ``table`` (``billing_summary`` or ``public.billing_summary``,
        the name errors, metrics and ``status`` print), by reason: ``stale``, ``missing``..."""
        name = TableName.parse(table)
        with self._admin() as conn:
            rows = conn.execute(
                "SELECT reason, count FROM fencekit.rejections "
                "WHERE schema_name = %s AND table_name = %s",
                (name.schema, name.name),
            ).fetchall()
        return {str(r): int(n) for r, n in rows}

    def fence(self, table: str) -> int | None:
        """The highest token ``table`` has accepted (over its keys or rows), or None."""
        spec = self.spec_of(table)
        if spec is None:
            return None
        with self._admin() as conn:
            if spec.scope.value == "row":
                q = sql.SQL("SELECT max({}) FROM {}").format(
                    sql.Identifier(spec.column), sql.SQL(spec.table.sql)
                )
                row = conn.execute(q).fetchone()
            else:
                row = conn.execute(
                    "SELECT max(fence) FROM fencekit.fences WHERE resource = %s",
                    (spec.resource_name,),
                ).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def lease(self, resource: str) -> dict[str, Any] | None:
        """The built-in issuer's row for ``resource`` (holder, token, expires_in seconds)."""
        with self._admin() as conn:
            row = conn.execute(
                "SELECT holder, token, extract(epoch FROM expires_at - clock_timestamp())::float8 "
                "FROM fencekit.leases WHERE resource = %s",
                (resource,),
            ).fetchone()
        if row is None:
            return None
        return {"holder": row[0], "token": int(row[1]),
                "expires_in": None if row[2] is None else float(row[2])}  # fmt: skip

    def snapshot(self, table: str) -> list[str]:
        """Every row of ``table`` as JSON text, sorted: what a later write would change."""
        name = TableName.parse(table)
        spec = self.spec_of(table)
        drop = sql.SQL(" - {}").format(sql.Literal(spec.column)) if spec else sql.SQL("")
        with self._admin() as conn:
            q = sql.SQL("SELECT (to_jsonb(t){})::text FROM {} AS t ORDER BY 1").format(
                drop, sql.SQL(name.sql)
            )
            return [str(r[0]) for r in conn.execute(q)]

    def track(self, table: str) -> None:
        """Record what ``table`` accepts in the write history although it has no fence (keyed
        by its primary key): a run of unfenced workers is then judged too."""
        if self.spec_of(table) is not None:
            return  # a fenced table is recorded already
        spec = FenceSpec(TableName.parse(table))  # a row spec: the primary key is the key
        with self._admin() as conn:
            _run(conn, history.track_statements(conn, spec))

    def history_events(self) -> list[dict[str, Any]]:
        """The write history as chaos-checker events (:mod:`fencekit.testing.history`)."""
        if not self.template.setup.history:
            raise SetupError("this database was built with history=False")
        with self._admin() as conn:
            return history.checker_events(conn)
