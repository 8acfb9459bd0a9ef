"""The pytest plugin (entry point ``pytest11``: ``fencekit``): options and fixtures.

It ships as its own distribution, pytest-fencekit: installing pg-fencekit loads no plugin.

Fixtures:

- ``fencekit_server`` (session): the server the databases live on (:mod:`.servers`).
- ``fenced_db``: a fresh :class:`~fencekit.testing.FencedDatabase` per test, cloned from a
  template built once per session from the ini options below.

Make others with :func:`pytest_fencekit.fenced_database` (schema, fences, role, scope), as
pytest-postgresql's factories make theirs.

ini options (``[pytest]`` / ``[tool.pytest.ini_options]``):

- ``fencekit_server``: ``auto`` (default), ``proc``, ``noproc``, ``dsn`` or ``embedded``;
- ``fencekit_dsn``: the server for ``dsn`` (else ``--fencekit-dsn`` or ``FENCEKIT_TEST_DSN``);
- ``fencekit_schema``: an ``alembic.ini``, a ``.sql`` file, or ``module:function(dsn)``;
- ``fencekit_fences``: ``module:attribute``, a SQLAlchemy ``MetaData`` with declared fences or
  a list of ``FenceSpec``;
- ``fencekit_app_role``: the application role (default ``fencekit_test_app``);
- ``fencekit_history``: record accepted writes for the checker (default true).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fencekit.testing import servers
from fencekit.testing.assertions import pop_current_database, push_current_database
from fencekit.testing.database import (
    DEFAULT_APP_ROLE,
    FENCEKIT_ROLES,
    DatabaseSetup,
    FencedDatabase,
    SchemaSource,
    Template,
    build_template,
    cluster_roles,
    drop_roles,
    drop_template,
)

__all__ = ["fenced_database"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fencekit", "fencekit testing kit")
    group.addoption("--fencekit-server", dest="fencekit_server", choices=servers.CHOICES,
                    help="where the fenced databases live (default: the fencekit_server ini "
                         "option, else auto)")  # fmt: skip
    group.addoption("--fencekit-dsn", dest="fencekit_dsn",
                    help=f"a server to use (superuser DSN); also {servers.DSN_ENV}")  # fmt: skip
    parser.addini("fencekit_server", "auto, proc, noproc, dsn or embedded", default="auto")
    parser.addini("fencekit_dsn", "superuser DSN of the server for fencekit_server=dsn")
    parser.addini("fencekit_schema", "alembic.ini, a .sql file, or module:function(dsn)")
    parser.addini("fencekit_fences", "module:attribute: a MetaData or a list of FenceSpec")
    parser.addini("fencekit_app_role", "the application role", default=DEFAULT_APP_ROLE)
    parser.addini("fencekit_history", "record accepted writes", type="bool", default=True)


def _dsn(config: pytest.Config) -> str | None:
    return (
        config.getoption("fencekit_dsn")
        or str(config.getini("fencekit_dsn") or "")
        or os.environ.get(servers.DSN_ENV)
        or None
    )


@pytest.fixture(scope="session")
def fencekit_server(request: pytest.FixtureRequest) -> Iterator[servers.Server]:
    """The PostgreSQL server the fenced databases are created on (session)."""
    config = request.config
    dsn = _dsn(config)
    wanted = config.getoption("fencekit_server") or str(config.getini("fencekit_server"))
    try:  # pytest-postgresql's own setting; absent when its plugin is disabled (-p no:...)
        pg_ctl = str(config.getoption("postgresql_exec") or config.getini("postgresql_exec"))
    except ValueError:
        pg_ctl = ""
    kind = servers.choose(wanted, dsn=dsn, pg_ctl=pg_ctl)
    if kind == "dsn":
        if not dsn:
            raise pytest.UsageError(
                f"fencekit_server = dsn needs a server: --fencekit-dsn, the fencekit_dsn ini "
                f"option or {servers.DSN_ENV}"
            )
        yield servers.from_dsn(dsn)
    elif kind in ("proc", "noproc"):
        if kind == "proc" and os.geteuid() == 0:
            raise pytest.UsageError(
                "fencekit_server = proc: PostgreSQL refuses to run as root, and "
                "pytest-postgresql's postgresql_proc runs pg_ctl as the current user. Run the "
                "tests as another user, or use fencekit_server = embedded (pgserver runs the "
                "server as a user of its own), dsn or noproc"
            )
        executor = request.getfixturevalue(f"postgresql_{kind}")
        yield servers.from_executor(kind, executor)
    else:
        from fencekit.embedded import start_embedded

        server = start_embedded()
        try:
            _make_fast(server.dsn)
            yield servers.Server("embedded", server.host, server.port, server.user,
                                 server.password)  # fmt: skip
        finally:
            server.stop()


def _make_fast(dsn: str) -> None:
    """A throwaway server: durability buys nothing, speed buys shorter tests."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        for setting in ("fsync", "synchronous_commit", "full_page_writes"):
            conn.execute(f"ALTER SYSTEM SET {setting} = off")
        conn.execute("SELECT pg_reload_conf()")


@pytest.fixture(scope="session")
def _fencekit_templates(fencekit_server: servers.Server) -> Iterator[dict[str, Template]]:
    templates: dict[str, Template] = {}
    there = cluster_roles(fencekit_server)
    yield templates
    for tpl in templates.values():
        drop_template(tpl)
    # Roles are cluster-wide: drop those this session created, keep those it found.
    apps = [t.setup.app_role for t in templates.values()]
    made = [r for r in dict.fromkeys([*apps, *FENCEKIT_ROLES]) if r not in there]
    drop_roles(fencekit_server, made)


def _template(request: pytest.FixtureRequest, setup: DatabaseSetup) -> Template:
    templates: dict[str, Template] = request.getfixturevalue("_fencekit_templates")
    server: servers.Server = request.getfixturevalue("fencekit_server")
    key = setup.fingerprint()
    if key not in templates:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "")
        with _django_db_unblocked(request):
            templates[key] = build_template(server, setup, f"fk_tmpl_{key}{worker}_{os.getpid()}")
    return templates[key]


def _django_db_unblocked(request: pytest.FixtureRequest) -> contextlib.AbstractContextManager[Any]:
    """pytest-django blocks database access outside its own fixtures; the template's schema may
    be a Django project's migrations (fencekit.django.testing:migrate)."""
    if request.config.pluginmanager.hasplugin("django"):
        blocker = request.getfixturevalue("django_db_blocker")
        if blocker is not None:  # None: pytest-django installed in a project without Django
            return blocker.unblock()  # type: ignore[no-any-return]
    return contextlib.nullcontext()


_counter = [0]


def _clone(tpl: Template) -> tuple[FencedDatabase, Any]:
    from pytest_postgresql.janitor import DatabaseJanitor

    _counter[0] += 1
    s = tpl.server
    name = f"fk_test_{os.getpid()}_{_counter[0]}"
    janitor = DatabaseJanitor(
        user=s.user, host=s.host, port=s.port, password=s.password, dbname=name,
        template_dbname=tpl.name, maintenance_dbname=s.maintenance_dbname,
    )  # fmt: skip
    janitor.drop()
    janitor.init()
    return FencedDatabase(tpl, name), janitor


def _from_ini(config: pytest.Config) -> DatabaseSetup:
    text = str(config.getini("fencekit_schema") or "")
    schema: SchemaSource = text or None
    if Path(text).suffix in (".ini", ".sql"):
        schema = str(Path(str(config.rootpath)) / text)  # an absolute path stays as it is
    fences: Any = ()
    target = str(config.getini("fencekit_fences") or "")
    if target:
        from fencekit.testing._bootstrap import resolve_attr

        fences = resolve_attr(target)
    return DatabaseSetup(
        schema=schema,
        fences=fences,
        app_role=str(config.getini("fencekit_app_role") or DEFAULT_APP_ROLE),
        history=bool(config.getini("fencekit_history")),
    )


def fenced_database(
    *,
    schema: SchemaSource = None,
    fences: Any = None,
    app_role: str | None = None,
    history: bool | None = None,
    alembic_revision: str = "head",
    scope: str = "function",
) -> Callable[..., Iterator[FencedDatabase]]:
    """A fixture giving a fenced database, like ``fenced_db`` with its own settings.

    ``schema``: an ``alembic.ini`` path, a ``.sql`` path, ``module:function`` or a callable
    taking the DSN; ``fences``: ``FenceSpec`` objects or a SQLAlchemy ``MetaData`` whose declared
    fences are protected (tables a migration protected already stay as they are); ``scope``:
    ``"function"`` (a fresh database per test) or ``"session"`` (one for the session). Options
    left as None come from the ini file::

        billing_db = fenced_database(schema="docs/examples/billing/alembic.ini")
    """

    @pytest.fixture(scope=scope)  # type: ignore[call-overload, untyped-decorator]
    def _fixture(request: pytest.FixtureRequest) -> Iterator[FencedDatabase]:
        base = _from_ini(request.config)
        setup = DatabaseSetup(
            schema=base.schema if schema is None else schema,
            fences=base.fences if fences is None else fences,
            app_role=app_role or base.app_role,
            history=base.history if history is None else history,
            alembic_revision=alembic_revision,
        )
        tpl = _template(request, setup)
        db, janitor = _clone(tpl)
        push_current_database(db)
        try:
            yield db
        finally:
            pop_current_database(db)
            db.close()
            janitor.drop()

    return _fixture  # type: ignore[no-any-return]


fenced_db = fenced_database()
fenced_db.__doc__ = "A fresh fenced database per test, set up from the fencekit_* ini options."
