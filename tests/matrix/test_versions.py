"""Which PostgreSQL majors fencekit installs on, and what it refuses on the newest ones.

The core install refuses a major outside ``fencekit.tested_postgres()`` (YF000) unless the
session sets ``fencekit.allow_untested_postgres`` (``fencekit install --allow-untested-postgres``).
Every server of the matrix is a tested major, so the refusal is exercised through
``fencekit.check_postgres_version`` with a range that leaves the server out: the same function
the install calls with the tested range.
"""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
import pytest

from fencekit.cli import main as cli_main
from fencekit.embedded import EmbeddedServer
from tests import pg_binaries
from tests.conftest import DEFAULT_MATRIX, nominal_major
from tests.core.helpers import USAGE, Conn, one, protect, rows

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_tested_range_is_the_matrix(db: Conn, target_server: EmbeddedServer) -> None:
    """The range install accepts is exactly the majors the version matrix covers."""
    lo, hi = one(db, "SELECT ARRAY[lower(r), upper(r) - 1] FROM fencekit.tested_postgres() r")
    covered = {nominal_major(t) for t in DEFAULT_MATRIX}
    assert covered == set(range(lo, hi + 1)) == set(pg_binaries.RELEASES)
    assert lo <= target_server.server_version_num // 10000 <= hi
    started = (DOCS / "getting-started.md").read_text()
    assert f"PostgreSQL {lo} to {hi}" in started
    assert not re.search(r"PostgreSQL 13\+", started)


def test_install_refuses_an_untested_major_unless_told(raw_db: Conn) -> None:
    from fencekit.sqlgen import render_install

    # The core install itself passes on every server of the matrix (a tested major) ...
    raw_db.commit()
    raw_db.autocommit = True
    raw_db.execute(render_install().encode())  # type: ignore[call-overload]
    raw_db.autocommit = False
    major = raw_db.info.server_version // 10000
    elsewhere = f"int4range({major + 1}, {major + 5})"
    # ... and the check it runs refuses a server outside the range it is given.
    with pytest.raises(psycopg.Error) as info:
        raw_db.execute(f"SELECT fencekit.check_postgres_version({elsewhere})")
    raw_db.rollback()
    err = info.value
    assert err.sqlstate == USAGE
    version = one(raw_db, "SHOW server_version")
    assert f"PostgreSQL {version} is not tested" in str(err)
    assert f"tested: PostgreSQL {major + 1} to {major + 4}" in str(err)
    assert "--allow-untested-postgres" in (err.diag.message_hint or "")
    # The override: a warning, and the install goes on.
    warnings: list[str] = []
    raw_db.add_notice_handler(lambda d: warnings.append(str(d.message_primary)))
    raw_db.execute("SET LOCAL fencekit.allow_untested_postgres = on")
    raw_db.execute(f"SELECT fencekit.check_postgres_version({elsewhere})")
    raw_db.rollback()
    assert any("not tested on" in w and "allow_untested_postgres" in w for w in warnings)


def test_cli_install_takes_the_override(raw_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["install", "--dsn", raw_dsn, "--allow-untested-postgres"]) == 0
    assert "installed fencekit core" in capsys.readouterr().out
    with psycopg.connect(raw_dsn) as conn:
        assert one(conn, "SELECT fencekit.tested_postgres() @> 14") is True


@pytest.mark.pg_since(18)
def test_virtual_generated_key_column_is_refused(db: Conn) -> None:
    """PostgreSQL 18's virtual generated columns hold no value in the transition tables a key
    fence reads its keys from: protect refuses them, names the column and says what to use."""
    db.execute(
        "CREATE TABLE vk (id int PRIMARY KEY, n int NOT NULL, "
        "shard int GENERATED ALWAYS AS (n % 4) VIRTUAL)"
    )
    db.commit()
    with pytest.raises(psycopg.Error) as info:
        protect(db, "vk", "key", key=("shard",))
    err = info.value
    assert err.sqlstate == USAGE
    assert "key column shard of public.vk is a virtual generated column" in str(err)
    assert "STORED" in (err.diag.message_hint or "")
    assert err.diag.column_name == "shard"
    assert rows(db, "SELECT count(*) FROM fencekit.protected") == [(0,)]
    assert rows(db, "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'vk'::regclass") == [(0,)]
    # Keyed on what it is computed from, the table is protected and fenced.
    protect(db, "vk", "key", key=("n",))
    assert rows(db, "SELECT count(*) FROM fencekit.protected") == [(1,)]
