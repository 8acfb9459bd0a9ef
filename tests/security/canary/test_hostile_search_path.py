"""Canary matrix, hostile search_path: operators planted where a caller's connection looks.

A migration or a test hands fencekit its own connection, whose search_path is the caller's
(``"$user", public`` by default). An operator there whose operand types match exactly beats
pg_catalog's one reached by an implicit cast: ``=(oid, regclass)`` wins ``d.refclassid =
'pg_extension'::regclass``. The table owner plants them (it may CREATE on the database and on
``public``) in ``public`` and in schemas named after the migrating superuser and the
fencekit_admin member, for every operator name and operand-type pair that an exact match
could win over a built-in operator, derived from pg_operator and pg_cast for the types of the
catalogs' and fencekit's own columns, not listed by hand. Each counts its calls.

Then every alembic operation (alembic's registry of fencekit's operations, the enforce and
rollout switches included), every Django operation (every Operation subclass in
fencekit.django) and every CLI command (the CLI's own parser, as the superuser and as the
admin member) runs against the owner's tables; one of them is in rollout mode with a writer
attributed by query id and pg_stat_statements installed, so the enforce check reads it. No
planted operator may run.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import pkgutil
import secrets
from collections.abc import Iterator
from typing import Any, ClassVar

import psycopg
import pytest
from psycopg import sql

from fencekit.cli import main
from tests.security.canary._builders import CLI_ARGS, READ_ONLY, TARGETS, cli_commands
from tests.security.canary.conftest import Planted, spec_of

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)

PIN = "-c search_path=pg_catalog,pg_temp"

# Every (name, left, right) an exact match could win over a built-in operator reached by an
# implicit cast, for the types of the catalogs' and fencekit's columns.
_PLANT = r"""
DO $plant$
DECLARE
  o record;
  sch text;
  n integer := 0;
BEGIN
  CREATE SCHEMA hostile_log;
  CREATE SEQUENCE hostile_log.hits;
  GRANT USAGE ON SCHEMA hostile_log TO PUBLIC;
  GRANT USAGE, UPDATE, SELECT ON SEQUENCE hostile_log.hits TO PUBLIC;
  FOR o IN
    WITH types(t) AS (
      SELECT DISTINCT a.atttypid FROM pg_catalog.pg_attribute a
        JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
       WHERE c.relnamespace IN ('pg_catalog'::regnamespace, 'fencekit'::regnamespace)
         AND a.attnum > 0 AND NOT a.attisdropped
      UNION SELECT t.oid FROM pg_catalog.pg_type t
       WHERE t.typname IN ('regclass', 'regproc', 'regprocedure', 'regtype', 'regrole',
                           'regnamespace', 'regoper', 'regoperator', 'text', 'int4', 'int8')
    ), usable(t) AS (
      SELECT types.t FROM types JOIN pg_catalog.pg_type y ON y.oid = types.t
       WHERE y.typtype IN ('b', 'd', 'e', 'r') AND y.typname <> 'unknown'
    ), to_type(src, dst) AS (
      SELECT u.t, u.t FROM usable u
      UNION SELECT c.castsource, c.casttarget FROM pg_catalog.pg_cast c
       WHERE c.castcontext = 'i' AND c.castsource IN (SELECT t FROM usable)
    ), candidates AS (
      SELECT DISTINCT ON (op.oprname, l.src, r.src)
             op.oprname, l.src AS lt, r.src AS rt, op.oprleft, op.oprright, op.oprresult
        FROM pg_catalog.pg_operator op
        JOIN to_type l ON l.dst = op.oprleft
        JOIN to_type r ON r.dst = op.oprright
       WHERE op.oprnamespace = 'pg_catalog'::regnamespace AND op.oprkind = 'b'
         AND (l.src, r.src) <> (op.oprleft, op.oprright)
         AND NOT EXISTS (SELECT FROM pg_catalog.pg_operator x
                          WHERE x.oprnamespace = 'pg_catalog'::regnamespace
                            AND x.oprname = op.oprname AND x.oprleft = l.src
                            AND x.oprright = r.src)
       ORDER BY op.oprname, l.src, r.src, op.oid
    )
    SELECT * FROM candidates
  LOOP
    FOREACH sch IN ARRAY string_to_array('{schemas}', ',') LOOP
      n := n + 1;
      EXECUTE format(
        'CREATE FUNCTION %I.hostile_%s(a %s, b %s) RETURNS %s LANGUAGE plpgsql AS $b$BEGIN '
        'PERFORM pg_catalog.nextval(''hostile_log.hits''); '
        'RETURN a::%s OPERATOR(pg_catalog.%s) b::%s; END$b$',
        sch, n, o.lt::regtype, o.rt::regtype, o.oprresult::regtype,
        o.oprleft::regtype, o.oprname, o.oprright::regtype);
      EXECUTE format('GRANT EXECUTE ON FUNCTION %I.hostile_%s(%s, %s) TO PUBLIC',
                     sch, n, o.lt::regtype, o.rt::regtype);
      EXECUTE format('CREATE OPERATOR %I.%s (LEFTARG = %s, RIGHTARG = %s, '
                     'FUNCTION = %I.hostile_%s)',
                     sch, o.oprname, o.lt::regtype, o.rt::regtype, sch, n);
    END LOOP;
  END LOOP;
  RAISE NOTICE 'planted % operators', n;
  IF n < 100 THEN
    RAISE EXCEPTION 'only % operators planted: the enumeration found nothing', n;
  END IF;
END
$plant$;
"""

ROLLOUT = "h_rollout"


def _hits(planted: Planted, db: str) -> int:
    with psycopg.connect(planted.dsn(db), options=PIN, autocommit=True) as c:
        row = c.execute("SELECT last_value, is_called FROM hostile_log.hits").fetchone()
    assert row is not None
    return int(row[0]) if row[1] else 0


def _stand_in_for_pg_stat_statements(su: psycopg.Connection[Any]) -> None:
    """What the enforce check looks up, where the server does not ship pg_stat_statements (the
    embedded one): an extension of that name with a superuser-owned view of that name as a
    member. Another extension is created and renamed (catalog surgery, superuser only)."""
    row = su.execute(
        "SELECT name FROM pg_available_extensions WHERE installed_version IS NULL"
        " AND name IN ('isn', 'seg', 'cube', 'ltree', 'hstore', 'citext', 'intarray')"
        " ORDER BY name LIMIT 1"
    ).fetchone()
    if row is not None:
        su.execute(sql.SQL("CREATE EXTENSION {} SCHEMA public").format(sql.Identifier(row[0])))
    else:  # the one the planted database handed its owner (extension-member) will do
        row = su.execute(
            "SELECT extname FROM pg_extension WHERE extname <> 'plpgsql' ORDER BY 1 LIMIT 1"
        ).fetchone()
    assert row is not None, "no extension to stand in for pg_stat_statements"
    su.execute("UPDATE pg_extension SET extname = 'pg_stat_statements' WHERE extname = %s", row)
    su.execute(
        "CREATE VIEW public.pg_stat_statements AS"
        " SELECT 0::bigint AS queryid, ''::text AS query WHERE false"
    )
    su.execute("ALTER EXTENSION pg_stat_statements ADD VIEW public.pg_stat_statements")


@pytest.fixture(scope="module")
def hostile(planted: Planted) -> Iterator[tuple[Planted, str]]:
    """A template: the planted database plus the owner's hostile operators and a table in
    rollout mode that a writer wrote without a token, attributed with its query id
    (pg_stat_statements installed where the server ships it: Debian's, not the embedded)."""
    name = f"hostile_tpl_{secrets.token_hex(4)}"
    server = planted.server
    with psycopg.connect(server.dsn, autocommit=True, options=PIN) as su:
        su.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(planted.template)
            )
        )
        superuser = su.execute("SELECT current_user").fetchone()
    assert superuser is not None
    try:
        with psycopg.connect(server.dsn_for(name), options=PIN, autocommit=True) as su:
            su.execute(
                sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                    sql.Identifier(name), sql.Identifier(planted.owner)
                )
            )
            # Where the server ships it: the enforce check then looks its view up in the
            # catalogs (loading it is not needed for that lookup)
            if su.execute(
                "SELECT FROM pg_available_extensions WHERE name = 'pg_stat_statements'"
            ).fetchone():
                su.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            else:
                _stand_in_for_pg_stat_statements(su)
            su.execute(
                sql.SQL("ALTER DATABASE {} SET compute_query_id = on").format(sql.Identifier(name))
            )
        with psycopg.connect(server.dsn_for(name, planted.owner), options=PIN) as oc:
            oc.execute(f"CREATE TABLE app.{ROLLOUT} (id int PRIMARY KEY, k int NOT NULL, v text)")
            oc.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON app.{ROLLOUT} TO {planted.writer}")
            oc.commit()
        from fencekit.spec import FenceSpec, TableName
        from fencekit.sqlgen import protect_statements

        spec = FenceSpec(TableName("app", ROLLOUT), on_missing="allow")
        with psycopg.connect(server.dsn_for(name), options=PIN) as su:
            for stmt in protect_statements(spec):
                su.execute(stmt.encode())
            su.commit()
        with psycopg.connect(server.dsn_for(name, planted.writer), autocommit=True) as w:
            w.execute(f"INSERT INTO app.{ROLLOUT} (id, k, v) VALUES (1, 1, 'a')")
        schemas = ",".join(str(r) for r in (superuser[0], planted.admin, "public"))
        with psycopg.connect(server.dsn_for(name, planted.owner), options=PIN) as oc:
            for s in (superuser[0], planted.admin):
                oc.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(str(s))))
                oc.execute(
                    sql.SQL("GRANT USAGE ON SCHEMA {} TO PUBLIC").format(sql.Identifier(str(s)))
                )
            oc.execute(_PLANT.replace("{schemas}", schemas).encode())
            oc.commit()
        with psycopg.connect(server.dsn, autocommit=True, options=PIN) as su:
            su.execute(sql.SQL("ALTER DATABASE {} IS_TEMPLATE true").format(sql.Identifier(name)))
        yield planted, name
    finally:
        with psycopg.connect(server.dsn, autocommit=True, options=PIN) as su:
            su.execute(sql.SQL("ALTER DATABASE {} IS_TEMPLATE false").format(sql.Identifier(name)))
            su.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@contextlib.contextmanager
def _fresh(hostile: tuple[Planted, str]) -> Iterator[str]:
    planted, template = hostile
    name = f"hostile_{secrets.token_hex(5)}"
    with psycopg.connect(planted.server.dsn, autocommit=True, options=PIN) as su:
        su.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        )
    try:
        yield name
    finally:
        with psycopg.connect(planted.server.dsn, autocommit=True, options=PIN) as su:
            su.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


class _Cells:
    def __init__(self) -> None:
        self.count = 0
        self.failures: list[str] = []

    def judge(self, cell: str, before: int, after: int) -> None:
        self.count += 1
        if after > before:
            self.failures.append(f"{cell}: {after - before} planted operator call(s)")

    def assert_clean(self) -> None:
        assert self.count, "no cell ran"
        assert not self.failures, "\n  ".join(["a planted operator ran:", *self.failures])


def _alembic_ops() -> dict[str, Any]:
    """Every operation class fencekit registers with alembic, from alembic's own registry."""
    from alembic.operations import Operations

    import fencekit.alembic_plugin  # noqa: F401  (registers the operations)

    out = {}
    for key in Operations._to_impl._registry:
        cls = key[0] if isinstance(key, tuple) else key
        if isinstance(cls, type) and cls.__module__.startswith("fencekit."):
            out[cls.__name__] = cls
    return out


def _alembic_instances(name: str, cls: Any, planted_writer: str) -> list[Any] | None:
    from fencekit import sqlgen
    from fencekit.spec import TableName
    from fencekit.sqlgen import FenceChange

    out: list[Any] = []
    for t in TARGETS:
        spec = spec_of(t)
        moved = spec.with_changes(
            **({"scope": "row", "key": ()} if t.scope == "key" else {"scope": "key", "key": ("k",)})
        )
        builders: dict[str, Any] = {
            "InstallCoreOp": lambda: [cls(sqlgen.CORE_VERSION)],
            "UpgradeCoreOp": lambda: [cls(sqlgen.CORE_VERSION, sqlgen.CORE_VERSION)],
            "UninstallCoreOp": lambda: [cls(sqlgen.CORE_VERSION)],
            "CreateFenceOp": lambda: [cls(FenceChange(None, spec))],  # noqa: B023
            "DropFenceOp": lambda: [cls(FenceChange(spec, None))],  # noqa: B023
            "AlterFenceOp": lambda: [cls(FenceChange(spec, moved))],  # noqa: B023
            "RenameFenceOp": lambda: [cls(spec, TableName("app", t.name + "_r"))],  # noqa: B023
            "EnforceFenceOp": lambda: [
                cls(ROLLOUT, schema="app", force=True),
                cls(ROLLOUT, schema="app", window="1s"),
                cls(ROLLOUT, schema="app", enforce=False),
            ],
            "GrantWriterOp": lambda: [cls(planted_writer)],
            "RevokeWriterOp": lambda: [cls(planted_writer)],
        }
        if name not in builders:
            return None
        out += builders[name]()
        if name not in ("CreateFenceOp", "DropFenceOp", "AlterFenceOp", "RenameFenceOp"):
            break  # not about a table: once is enough
    return out


def test_alembic_operations_on_a_hostile_search_path(hostile: tuple[Planted, str]) -> None:
    from alembic.migration import MigrationContext
    from alembic.operations import Operations
    from sqlalchemy import create_engine

    planted, _ = hostile
    found = _alembic_ops()
    assert "EnforceFenceOp" in found, sorted(found)
    missing = [n for n, c in found.items() if _alembic_instances(n, c, planted.writer) is None]
    assert not missing, f"alembic operations with no argument builder here: {missing}"
    cells = _Cells()
    for name, cls in sorted(found.items()):
        with _fresh(hostile) as db:
            url = planted.dsn(db).replace("postgresql://", "postgresql+psycopg://", 1)
            engine = create_engine(url)
            try:
                with engine.connect() as warm:  # the dialect's own first-connect queries
                    warm.rollback()
                for op in _alembic_instances(name, cls, planted.writer) or []:
                    before = _hits(planted, db)
                    with contextlib.suppress(Exception), engine.begin() as conn:
                        Operations(MigrationContext.configure(conn)).invoke(op)
                    cells.judge(f"alembic {name} {vars(op)}", before, _hits(planted, db))
            finally:
                engine.dispose()
    cells.assert_clean()


def test_migration_path_check_refuses_a_hostile_search_path(
    hostile: tuple[Planted, str],
) -> None:
    """What alembic's env.py runs before alembic reflects anything: on the migrating role's own
    path, through the planted "$user" schema, it refuses (as the superuser and as the admin)
    and runs none of the planted operators itself."""
    from fencekit.catalog.trusted_path import check_migration_path
    from fencekit.errors import CatalogError

    planted, _ = hostile
    with _fresh(hostile) as db:
        for user in (None, planted.admin):
            before = _hits(planted, db)
            with psycopg.connect(planted.dsn(db, user), autocommit=True) as conn:
                name = str(conn.execute("SELECT pg_catalog.current_user()").fetchone()[0])  # type: ignore[index]
                with pytest.raises(CatalogError, match=f'schema "{name}", owned by role'):
                    check_migration_path(conn)
            assert _hits(planted, db) == before, f"planted operator ran as {name}"


def _django_ops() -> dict[str, Any]:
    """Every Django Operation subclass defined in a module of fencekit.django."""
    from django.conf import settings

    if not settings.configured:
        settings.configure(DATABASES={}, INSTALLED_APPS=[])
    from django.db.migrations.operations.base import Operation

    import fencekit.django as pkg

    out: dict[str, Any] = {}
    for info in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + "."):
        try:
            mod = importlib.import_module(info.name)
        except Exception:  # a module that needs a configured Django app registry
            continue
        for n, c in vars(mod).items():
            if (
                inspect.isclass(c)
                and issubclass(c, Operation)
                and c.__module__ == mod.__name__
                and not n.startswith("_")
            ):
                out[n] = c
    return out


class _Editor:
    """What a Django operation needs of a schema editor, on a real psycopg connection."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.connection = _DjangoConnection(conn)

    def execute(self, sql: str, params: Any = None) -> None:
        self.conn.execute(sql.encode())


class _DjangoConnection:
    vendor = "postgresql"
    alias = "default"

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.connection = conn

    def ensure_connection(self) -> None:
        pass


def _django_state(model: str, table: str) -> Any:
    """A migration state whose app 'shop' has ``model`` on ``app.table`` with its fence."""

    class _Meta:
        db_table = table
        original_attrs: ClassVar[dict[str, Any]] = {}

    class _Model:
        _meta = _Meta

    class _Apps:
        def get_model(self, app_label: str, name: str) -> Any:
            return _Model

    class _State:
        apps = _Apps()

    return _State()


def test_django_operations_on_a_hostile_search_path(hostile: tuple[Planted, str]) -> None:
    from fencekit import sqlgen
    from fencekit.django.fences import Fence

    planted, _ = hostile
    found = _django_ops()
    assert "EnforceFence" in found, sorted(found)

    def build(name: str, cls: Any, t: Any) -> list[Any] | None:
        spec = spec_of(t)
        moved = spec.with_changes(
            **({"scope": "row", "key": ()} if t.scope == "key" else {"scope": "key", "key": ("k",)})
        )
        return {
            "InstallFencekit": lambda: [cls(sqlgen.CORE_VERSION)],
            "ProtectTable": lambda: [cls("m", spec)],
            "UnprotectTable": lambda: [cls("m", spec)],
            "MoveFence": lambda: [cls("m", spec, moved)],
            "EnforceFence": lambda: [cls("Rollout", force=True), cls("Rollout", window="1s")],
            "GrantFencekitWriter": lambda: [cls(planted.writer)],
            "RevokeFencekitWriter": lambda: [cls(planted.writer)],
        }.get(name, lambda: None)()

    missing = [n for n, c in found.items() if build(n, c, TARGETS[0]) is None]
    assert not missing, f"Django operations with no argument builder here: {missing}"
    cells = _Cells()
    state = _django_state("Rollout", ROLLOUT)
    for name, cls in sorted(found.items()):
        with _fresh(hostile) as db:
            for t in TARGETS:
                for op in build(name, cls, t) or []:
                    before = _hits(planted, db)
                    with psycopg.connect(planted.dsn(db)) as conn:
                        op._allowed = lambda *a: True
                        if name == "EnforceFence":
                            op.allow_migrate_model = lambda *a: True
                            state.apps.get_model("shop", "Rollout")._meta.original_attrs = {
                                "fence": Fence(schema="app", on_missing="allow")
                            }
                        with contextlib.suppress(Exception):
                            op.database_forwards("shop", _Editor(conn), state, state)
                            conn.commit()
                    cells.judge(f"django {name} {op.describe()}", before, _hits(planted, db))
    cells.assert_clean()


@pytest.mark.parametrize("role", ["superuser", "admin"])
def test_cli_commands_on_a_hostile_search_path(hostile: tuple[Planted, str], role: str) -> None:
    planted, _ = hostile
    cells = _Cells()
    user = None if role == "superuser" else planted.admin
    with _fresh(hostile) as shared:
        for command in cli_commands():
            # a command that writes gets a copy of its own; the others share one
            with contextlib.ExitStack() as stack:
                db = shared if command in READ_ONLY else stack.enter_context(_fresh(hostile))
                dsn = planted.dsn(db, user)
                for argv in CLI_ARGS[command](dsn):
                    before = _hits(planted, db)
                    with (
                        contextlib.redirect_stdout(io.StringIO()),
                        contextlib.redirect_stderr(io.StringIO()),
                        contextlib.suppress(Exception),
                    ):
                        main(argv)
                    shown = " ".join(a for a in argv if a not in (dsn, "--dsn"))
                    cells.judge(f"fencekit {shown} as {role}", before, _hits(planted, db))
    cells.assert_clean()
