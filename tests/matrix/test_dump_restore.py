"""A protected database survives pg_dump / pg_restore from each major into the next.

One database is protected on PostgreSQL 14 (a row fence, a key fence on a partitioned table
with a named resource, a table fence), then carried 14 -> 15 -> 16 -> 17 -> 18 the way a DBA
upgrades by dump and restore: the roles with ``pg_dumpall --globals-only``, the database with
``pg_dump -Fc`` and ``pg_restore``, both of the NEWER major (pg_dump supports older servers, not
newer ones). Every server and every tool of the chain is the matrix's pinned release of its
major (tests/pg_binaries.py): a minor release of Debian's or pgserver's build can add catalog
state an older release of the next major refuses (Debian's 15.20 stores a ``pg_attver`` column
option that PostgreSQL 16.15's restore rejects), and that is not what this test is about; the
DBA guide documents it, and a test below restores such a dump the way the guide says. After each
restore the fences
are still enforced, with the fences the old server had, for an application role (which proves
the trigger functions kept their owner and their SECURITY DEFINER), and then advance once more
before the next hop. At 18 the core is re-installed over the restored one (an upgrade in place).
"""

from __future__ import annotations

import itertools
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fencekit import sqlgen
from fencekit.embedded import EmbeddedServer
from tests import pg_binaries
from tests.core.helpers import MISSING, STALE, key_fence, one, protect, reject, rows, write

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
DB = "fk_dump_chain"
APP = "fk_chain_app"


def _server(request: pytest.FixtureRequest, major: int) -> EmbeddedServer:
    """The running pinned release of ``major`` (the version matrix's ``pgNN`` server)."""
    server: EmbeddedServer = request.getfixturevalue(f"pg{major}_server")
    assert server.server_version == pg_binaries.RELEASES[major]
    return server


def _tool(major: int, name: str) -> str:
    return str(pg_binaries.ensure(major) / name)


def _run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw)  # noqa: S603
    assert proc.returncode == 0, f"{cmd[0]} failed:\n{proc.stderr[-3000:]}"
    return proc


def _admin(server: EmbeddedServer) -> psycopg.Connection[Any]:
    return psycopg.connect(server.dsn, autocommit=True)


def _drop(server: EmbeddedServer) -> None:
    with _admin(server) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        admin.execute(f"DROP ROLE IF EXISTS {APP}")


def _build(server: EmbeddedServer) -> None:
    """The database on the oldest server: core, three protected tables, fences at 10."""
    _drop(server)
    with _admin(server) as admin:
        admin.execute(f"CREATE DATABASE {DB}")
        admin.execute(f"CREATE ROLE {APP} LOGIN")
    with psycopg.connect(server.dsn_for(DB)) as db:
        db.autocommit = True
        db.execute(sqlgen.render_install().encode())  # type: ignore[call-overload]
        db.autocommit = False
        db.execute(
            """CREATE TABLE acct (id int PRIMARY KEY, v text);
               CREATE TABLE ledger (account int NOT NULL, amount int)
                 PARTITION BY RANGE (account);
               CREATE TABLE ledger_a PARTITION OF ledger FOR VALUES FROM (0) TO (100);
               CREATE TABLE ledger_b PARTITION OF ledger FOR VALUES FROM (100) TO (200);
               CREATE TABLE report (v text);"""
        )
        db.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON acct, ledger, report TO {APP}")
        db.execute(f"GRANT USAGE ON SCHEMA public TO {APP}")
        db.commit()
        protect(db, "acct")
        protect(db, "ledger", "key", key=("account",), resource="ledger")
        protect(db, "report", "table")
        write(db, 10, "INSERT INTO acct VALUES (1, 'a'), (2, 'b')")
        write(db, 10, "INSERT INTO ledger VALUES (1, 5), (150, 7)")
        write(db, 10, "INSERT INTO report VALUES ('r')")


def _hop(
    old: EmbeddedServer, new: EmbeddedServer, new_major: int, tmp: Path, *, guide: bool = False
) -> None:
    """Roles, then the database, from ``old`` into ``new`` with the new major's tools: with
    ``pg_restore``, or (``guide``) through the DBA guide's pipeline that leaves out the
    ``pg_attver`` column options."""
    _drop(new)
    globals_sql = _run(
        [_tool(new_major, "pg_dumpall"), "--globals-only", "--no-role-passwords", "-d", old.dsn]
    ).stdout
    # Roles that exist already on the new cluster (its superuser, fencekit's roles from the
    # suite's own databases) make psql print errors for their CREATE ROLE: as in any real
    # restore of globals, those are expected; the check is that every role exists afterwards.
    subprocess.run(  # noqa: S603
        [_tool(new_major, "psql"), "-q", "-d", new.dsn],
        input=globals_sql,
        capture_output=True,
        text=True,
        timeout=60,
    )
    dump = tmp / f"chain-{new_major}.dump"
    _run([_tool(new_major, "pg_dump"), "-Fc", "-f", str(dump), "-d", old.dsn_for(DB)])
    with _admin(new) as admin:
        admin.execute(f"CREATE DATABASE {DB} TEMPLATE template0")
        assert admin.execute(
            "SELECT count(*) FROM pg_roles WHERE rolname IN (%s, 'fencekit_admin', "
            "'fencekit_writer')",
            (APP,),
        ).fetchone() == (3,)
    if not guide:
        _run([_tool(new_major, "pg_restore"), "--exit-on-error", "-d", new.dsn_for(DB), str(dump)])
        return
    bindir = str(pg_binaries.ensure(new_major))
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
    env |= {"DUMP": str(dump), "TARGET": new.dsn_for(DB)}
    _run(["bash", "-o", "pipefail", "-c", _guide_pipeline()], env=env)


def _guide_pipeline() -> str:
    """The one restore line of docs/dba-guide.md that leaves out ``pg_attver``."""
    text = (ROOT / "docs" / "dba-guide.md").read_text(encoding="utf-8")
    lines = [ln for ln in text.splitlines() if ln.startswith("pg_restore ") and "pg_attver" in ln]
    assert len(lines) == 1, f"docs/dba-guide.md: expected one pg_attver restore line, got {lines}"
    return lines[0]


def _check(server: EmbeddedServer, fence: int) -> int:
    """Every fence holds at ``fence`` on ``server``; a fresh token advances them all. Returns
    the new fence."""
    with psycopg.connect(server.dsn_for(DB)) as db:
        assert one(db, "SHOW server_version_num") == str(server.server_version_num)
        assert rows(db, "SELECT table_name, scope FROM fencekit.protected ORDER BY table_name") == [
            ("acct", "row"),
            ("ledger", "key"),
            ("report", "table"),
        ]
        # Restored triggers are enabled as they were (pg_restore ran without --disable-triggers).
        assert (
            one(
                db,
                "SELECT count(*) FROM pg_trigger "
                "WHERE tgname LIKE 'fencekit%%' AND tgenabled <> 'O'",
            )
            == 0
        )
        assert rows(db, "SELECT id, fencekit_fence FROM acct ORDER BY id") == [
            (1, fence),
            (2, fence),
        ]
        assert key_fence(db, "ledger", "1") == fence
        assert key_fence(db, "public.report") == fence
    with psycopg.connect(server.dsn_for(DB, user=APP)) as app:
        for stmt in (
            "UPDATE acct SET v = 'stale' WHERE id = 1",
            "INSERT INTO ledger VALUES (1, -1)",
            "DELETE FROM report",
        ):
            reject(app, STALE, fence - 1, stmt)
            reject(app, MISSING, None, stmt)
        new = fence + 1
        write(app, new, "UPDATE acct SET v = 'hop' WHERE id IN (1, 2)")
        write(app, new, "INSERT INTO ledger VALUES (1, 1), (150, 1)")
        write(app, new, "UPDATE report SET v = 'hop'")
    with psycopg.connect(server.dsn_for(DB)) as db:
        assert rows(db, "SELECT DISTINCT fencekit_fence FROM acct") == [(new,)]
        assert key_fence(db, "ledger", "150") == new
        assert key_fence(db, "public.report") == new
    return new


@pytest.fixture
def chain(request: pytest.FixtureRequest) -> Iterator[dict[int, EmbeddedServer]]:
    servers = {major: _server(request, major) for major in sorted(pg_binaries.RELEASES)}
    yield servers
    for server in servers.values():
        _drop(server)


def test_dump_restore_between_adjacent_majors_keeps_fences_enforced(
    chain: dict[int, EmbeddedServer], tmp_path: Path
) -> None:
    majors = sorted(chain)
    assert majors == [14, 15, 16, 17, 18]
    _build(chain[majors[0]])
    fence = _check(chain[majors[0]], 10)
    for old, new in itertools.pairwise(majors):
        _hop(chain[old], chain[new], new, tmp_path)
        fence = _check(chain[new], fence)
    # An upgrade in place over the restored core keeps every fence and every check.
    newest = chain[majors[-1]]
    with psycopg.connect(newest.dsn_for(DB), autocommit=True) as db:
        db.execute(sqlgen.render_install().encode())  # type: ignore[call-overload]
    _check(newest, fence)


def test_a_debian_15_dump_restores_into_16_the_way_the_dba_guide_says(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Debian's own 15, whatever minor release it ships today, into the pinned 16. From 15.20
    on, every column carries a ``pg_attver`` option that 16.15's restore refuses: then the plain
    restore must fail on it (the problem the DBA guide describes is real), and the guide's
    pipeline must carry every fence across, still enforced. Debian's 15 is used on purpose here:
    it is the release that brings the option; the chain above stays on pinned releases."""
    old: EmbeddedServer = request.getfixturevalue("debian15_server")
    new = _server(request, 16)
    try:
        _build(old)
        with psycopg.connect(old.dsn_for(DB)) as db:
            attver = one(
                db,
                "SELECT count(*) FROM pg_attribute WHERE attrelid = 'acct'::regclass "
                "AND attoptions::text LIKE '%%pg_attver=%%'",
            )
        if attver:
            with pytest.raises(AssertionError, match="pg_attver"):
                _hop(old, new, 16, tmp_path)
        _hop(old, new, 16, tmp_path, guide=True)
        _check(new, 10)
    finally:
        _drop(old)
        _drop(new)
