"""Canary matrix, planted on ``core``: schema ``fencekit`` as a table owner with CREATE on the
database can leave it before the first install or after ``fencekit uninstall``
(docs/dev/code-paths.md, the rows planted on ``core``; :mod:`._core_plant`).

Every entry point the matrix enumerates runs against each variant: every CLI command from the
CLI's own parser as a superuser and as a fencekit_admin member, the script ``fencekit sql
install`` prints run with psql (as both), every alembic operation from alembic's registry and
every Django operation. No canary may run as anyone but the owner, the catalogs of schema
fencekit must be as they were, and every entry point that installs or upgrades the core must
refuse with its clear error (YF000). A new install path is an entry point of one of those
lists: it gets its cells without anyone writing them, and fails them if it does not refuse.

One copy of the planted database per variant: every cell must leave it as it was.
"""

from __future__ import annotations

import contextlib
import io
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from fencekit.cli import main
from fencekit.embedded import EmbeddedServer
from tests.security.canary import _core_plant, _plant
from tests.security.canary import _migrations as mig
from tests.security.canary._builders import CLI_ARGS, TARGETS, cli_commands
from tests.security.canary._cells import fired
from tests.security.canary.conftest import Planted

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)

#: The message of the install's refusal (SQLSTATE YF000).
REFUSAL = "refusing to install into, or read, schema fencekit"

#: Entry points that install or upgrade the core: each must refuse with YF000.
INSTALLERS = {
    "fencekit install",
    "psql < fencekit sql install",
    "alembic InstallCoreOp",
    "alembic UpgradeCoreOp",
    "django InstallFencekit",
}

SNAPSHOT = """
SELECT 'schema', n.nspname::text, n.nspowner::regrole::text FROM pg_namespace n
 WHERE n.nspname = 'fencekit'
UNION ALL
SELECT 'relation ' || c.relkind::text, c.oid::regclass::text, c.relowner::regrole::text
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'fencekit'
UNION ALL
SELECT 'function', p.oid::regprocedure::text,
       p.proowner::regrole::text || ' ' || md5(p.prosrc) || ' ' || p.prosecdef::text
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'fencekit'
UNION ALL
SELECT 'type', t.oid::regtype::text, t.typowner::regrole::text
  FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE n.nspname = 'fencekit'
UNION ALL
SELECT 'trigger', g.tgname::text, g.tgrelid::regclass::text FROM pg_trigger g
  JOIN pg_class c ON c.oid = g.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'fencekit' AND NOT g.tgisinternal
UNION ALL
SELECT 'rule', r.rulename::text, r.ev_class::regclass::text FROM pg_rewrite r
  JOIN pg_class c ON c.oid = r.ev_class JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'fencekit'
UNION ALL
SELECT 'role', r.rolname::text, r.rolsuper::text FROM pg_roles r WHERE r.rolname = %s
ORDER BY 1, 2, 3
"""


def _build(server: EmbeddedServer, template: str, sfx: str) -> Planted:
    owner, admin = f"cc_owner_{sfx}", f"cc_admin_{sfx}"
    labels = sorted({label for v in _core_plant.variants(owner) for label in v.labels})
    with psycopg.connect(server.dsn, autocommit=True) as su:
        su.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(template)))
        su.execute(f"CREATE ROLE {owner} LOGIN")
        su.execute(f"CREATE ROLE {admin} LOGIN")
        for role in ("fencekit_admin", "fencekit_writer"):  # as the install makes them
            # another worker's install may make it at the same moment
            with contextlib.suppress(
                psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation
            ):
                su.execute(f"CREATE ROLE {role} NOLOGIN")
        su.execute(f"GRANT fencekit_admin TO {admin}")
        su.execute(f"GRANT CREATE ON DATABASE {template} TO {owner}")
    with psycopg.connect(server.dsn_for(template), autocommit=True) as su:
        su.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    canary = _plant.CANARY.replace("{owner}", owner).replace("{writer}", f"{owner}_nobody")
    with psycopg.connect(server.dsn_for(template, owner)) as oc:
        oc.execute(canary.encode())
        oc.execute(_plant.sequences(labels).encode())
        oc.execute(_core_plant.OWN.encode())
        oc.commit()
    with psycopg.connect(server.dsn, autocommit=True) as su:
        su.execute(sql.SQL("ALTER DATABASE {} IS_TEMPLATE true").format(sql.Identifier(template)))
    return Planted(server, template, owner, f"{owner}_nobody", admin, labels)


@pytest.fixture(scope="module")
def bare(pg_server: EmbeddedServer) -> Iterator[Planted]:
    """A database without fencekit: the owner (CREATE on the database), its canaries and
    helpers, and a fencekit_admin member that may also create schemas."""
    sfx = secrets.token_hex(3)
    template = f"canary_core_{sfx}"
    try:
        yield _build(pg_server, template, sfx)
    finally:
        with psycopg.connect(pg_server.dsn, autocommit=True) as su:
            su.execute(
                sql.SQL("ALTER DATABASE {} IS_TEMPLATE false").format(sql.Identifier(template))
            )
            su.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(template))
            )
            for role in (f"cc_owner_{sfx}", f"cc_admin_{sfx}"):
                su.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


# ---------------------------------------------------------------- entry points


def _cli(argv: list[str]) -> str:
    """One CLI invocation in-process; what it said on stderr (a refusal is fine)."""
    err = io.StringIO()
    with (
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(err),
        contextlib.suppress(Exception),
    ):
        main(argv)
    return err.getvalue()


def _psql_install(dsn: str) -> str:
    """``fencekit sql install | psql``: the DBA path without Python near the server."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["sql", "install"])
    psql = shutil.which("psql")
    assert psql, "psql is needed to run the printed install script"
    done = subprocess.run(
        [psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-v", "VERBOSITY=verbose", "-d", dsn],
        input=out.getvalue(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.stderr


def _said(exc: BaseException | None) -> str:
    """An operation's error with its SQLSTATE, through SQLAlchemy's wrapping."""
    parts = []
    for _ in range(5):
        if exc is None:
            break
        parts.append(f"{getattr(exc, 'sqlstate', None) or ''}: {exc}")
        exc = getattr(exc, "orig", None) or exc.__cause__
    return " | ".join(parts)


Cell = tuple[str, Callable[[], str]]

#: Commands that do not use the database they are given (offline, or they make a database of
#: their own): what they do does not depend on the variant, so they run in the first only.
ELSEWHERE = frozenset(
    {
        "sql install",
        "sql protect",
        "sql unprotect",
        "sql rename",
        "sql uninstall",
        "monitoring",
        "alembic init",
        "chaos check",
        "dev-server",
        "demo",
        "bench",
    }
)


def entry_points(bare: Planted, db: str, *, first: bool) -> Iterator[Cell]:
    """(cell name, run) for every entry point; run returns what it said (errors)."""
    missing = [c for c in cli_commands() if c not in CLI_ARGS]
    assert not missing, f"CLI commands with no argument builder: {missing} (see _builders.py)"
    for role, user in (("superuser", None), ("admin", bare.admin)):
        dsn = bare.dsn(db, user)
        for command in cli_commands():
            if command in ELSEWHERE and not first:
                continue
            # no table of the builders exists here: one invocation per form of the command
            argvs = CLI_ARGS[command](dsn)
            for argv in argvs if len(argvs) <= 2 else argvs[:1]:
                shown = " ".join(a for a in argv if a not in (dsn, "--dsn"))
                yield f"fencekit {shown} as {role}", lambda argv=argv: _cli(argv)
        yield f"psql < fencekit sql install as {role}", lambda dsn=dsn: _psql_install(dsn)
    assert not mig.missing_alembic_builders(), "see test_migrations.py"
    assert not mig.missing_django_builders(), "see test_migrations.py"
    target = TARGETS[0]
    for name, cls in mig.alembic_ops().items():
        for op in mig.alembic_instances(name, cls, target) or []:

            def run_alembic(op: Any = op) -> str:
                with mig.alembic_runner(bare.dsn(db)) as run:
                    return _said(run(op))

            yield f"alembic {name}", run_alembic
    for name, cls in mig.django_ops().items():
        for op in mig.django_instances(name, cls, target) or []:
            yield (
                f"django {name}",
                lambda op=op: _said(mig.run_django(bare.dsn(db), op)),
            )


def _installer(cell: str) -> bool:
    return cell.removesuffix(" as superuser").removesuffix(" as admin") in INSTALLERS


# ---------------------------------------------------------------- the cells


def _plant_variant(bare: Planted, db: str, variant: _core_plant.Variant) -> None:
    with psycopg.connect(bare.dsn(db), autocommit=True) as su:
        # a database's ACL is not copied from its template
        su.execute(f"GRANT CREATE ON DATABASE {db} TO {bare.owner}, {bare.admin}")
        if variant.before_sql:
            su.execute(variant.before_sql.encode())
    with psycopg.connect(bare.dsn(db, bare.owner)) as oc:
        oc.execute(variant.owner_sql.encode())
        oc.commit()
    with psycopg.connect(bare.dsn(db), autocommit=True) as su:
        if variant.after_sql:
            su.execute(variant.after_sql.encode())


def _snapshot(bare: Planted, db: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(bare.dsn(db), autocommit=True) as su:
        return su.execute(SNAPSHOT, (bare.owner,)).fetchall()


@pytest.mark.parametrize(
    "variant", _core_plant.variants("x"), ids=[v.name for v in _core_plant.variants("x")]
)
def test_no_entry_point_runs_the_owners_code_in_schema_fencekit(
    bare: Planted, variant: _core_plant.Variant
) -> None:
    variant = next(v for v in _core_plant.variants(bare.owner) if v.name == variant.name)
    failures: list[str] = []
    cells = 0
    installers: set[str] = set()
    spent: dict[str, float] = {}
    with bare.fresh() as db:
        _plant_variant(bare, db, variant)
        planted = _snapshot(bare, db)
        first = variant.name == _core_plant.variants(bare.owner)[0].name
        for cell, run in entry_points(bare, db, first=first):
            cells += 1
            before = bare.hits(db)
            started = time.perf_counter()
            said = run()
            spent[cell] = time.perf_counter() - started
            after = bare.hits(db)
            for label, now in sorted(after.items()):
                was = before.get(label, {}).get("other", 0)
                if now.get("other", 0) > was:
                    failures.append(
                        f"{cell}: {label} ran {now['other'] - was}x as {now.get('role')} "
                        f"(session {now.get('session')})"
                    )
            if _installer(cell):
                installers.add(cell.removesuffix(" as superuser").removesuffix(" as admin"))
                # the CLI prints the message; psql and the drivers also give the SQLSTATE
                if REFUSAL not in said or ("YF000" not in said and not cell.startswith("fencekit")):
                    failures.append(f"{cell}: did not refuse with YF000: {said[:300]!r}")
            now_snapshot = _snapshot(bare, db)
            if now_snapshot != planted:
                gone = sorted(set(planted) - set(now_snapshot))
                new = sorted(set(now_snapshot) - set(planted))
                failures.append(f"{cell}: changed schema fencekit: removed {gone}, added {new}")
                planted = now_snapshot  # judge the next cell from here
        # control: the owner's own use runs every canary of the variant, as the owner
        before = bare.hits(db)
        with psycopg.connect(bare.dsn(db, bare.owner), autocommit=True) as oc:
            for stmt in _core_plant.CONTROL:
                with contextlib.suppress(psycopg.Error):
                    oc.execute(stmt)
        silent = sorted(set(variant.labels) - fired(before, bare.hits(db)))
    slowest = sorted(spent.items(), key=lambda kv: -kv[1])[:5]
    print(f"{variant.name}: {cells} cells, {sum(spent.values()):.1f}s in entry points; slowest:")
    for cell, seconds in slowest:
        print(f"  {seconds:.2f}s {cell}")
    assert installers == INSTALLERS, f"install entry points not run: {INSTALLERS - installers}"
    assert not silent, f"planted canaries that never ran, even for the owner: {silent}"
    if failures:
        shown = "\n  ".join(failures)
        raise AssertionError(
            f"{variant.name}: {len(failures)} failures in {cells} cells:\n  {shown}"
        )
