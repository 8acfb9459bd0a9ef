"""Every literal fencekit generates means the same under ``standard_conforming_strings = off``.

With it off, a backslash in a plain '...' literal is an escape: a name holding a backslash
would be read as another name, or end the literal early. Protect and unprotect scripts, the
generated trigger functions (their bodies are parsed in the writer's session) and alembic's
offline SQL run here in sessions with the setting off, with names holding quotes, backslashes
and unicode, and must act on exactly those names.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from fencekit.spec import FenceSpec, Scope, TableName
from fencekit.sqlgen import render_protect, render_unprotect
from tests.alembic.conftest import client_bin, make_project

OFF = "SET standard_conforming_strings = off"
HOSTILE = [
    "t\\'; x \\",  # a backslash before a quote, a trailing backslash
    "a\\b\\\\c\\n",  # backslash escapes that would become a backspace, a newline
    "ünï\\cødé 'q' 名前",
]


def _script(conn: psycopg.Connection[Any], script: str) -> None:
    conn.autocommit = True
    try:
        conn.execute(OFF)
        conn.execute(script.encode())
    finally:
        conn.autocommit = False


@pytest.mark.parametrize("scope", ["row", "key", "table"])
@pytest.mark.parametrize("name", HOSTILE, ids=["quote", "escapes", "unicode"])
def test_scripts_and_triggers_with_standard_conforming_strings_off(
    db: psycopg.Connection[Any], scope: str, name: str
) -> None:
    t = sql.Identifier("public", name)
    col = sql.Identifier(name + "k")
    db.execute(sql.SQL("CREATE TABLE {} ({} int PRIMARY KEY, v int)").format(t, col))
    db.commit()
    kw: dict[str, Any] = {}
    if scope == "key":
        kw["key"] = (name + "k",)
    if scope != "row":
        kw["resource"] = name + "\\r"
    spec = FenceSpec(TableName("public", name), scope=Scope(scope), **kw)
    _script(db, render_protect(spec))
    got = db.execute("SELECT table_name, resource FROM fencekit.protected").fetchone()
    db.rollback()
    assert got is not None
    assert got[0] == name
    if scope != "row":
        assert got[1] == name + "\\r"
    # The writer's session has the setting off too: the generated bodies are parsed there.
    db.execute(OFF)
    db.commit()
    db.execute("SELECT set_config('fencekit.token', '10', true)")
    db.execute(sql.SQL("INSERT INTO {} VALUES (1, 0)").format(t))
    db.commit()
    db.execute("SELECT set_config('fencekit.token', '5', true)")
    with pytest.raises(psycopg.Error) as info:
        db.execute(sql.SQL("UPDATE {} SET v = 1").format(t))
    db.rollback()
    assert info.value.sqlstate == "YF001", info.value
    if scope != "row":
        fenced = db.execute("SELECT DISTINCT resource FROM fencekit.fences").fetchall()
        db.rollback()
        assert fenced == [(name + "\\r",)]
    _script(db, render_unprotect(spec))
    left = db.execute(
        "SELECT (SELECT count(*) FROM pg_trigger WHERE tgrelid = %s::regclass "
        "AND NOT tgisinternal), (SELECT count(*) FROM fencekit.protected)",
        (t.as_string(db),),
    ).fetchone()
    db.rollback()
    assert left == (0, 0)


MODELS = """
from sqlalchemy import Column, Integer, MetaData, Table, Text
from fencekit.declare import declare_fence

metadata = MetaData()
acct = Table(
    "o'b\\\\rien\\\\", metadata,
    Column("id", Integer, primary_key=True),
    Column("summary", Text),
)
declare_fence(acct, scope="key", key=["id"], resource="r\\\\'1")
"""


def test_alembic_offline_sql_with_standard_conforming_strings_off(
    tmp_path: Path, raw_dsn: str
) -> None:
    project = make_project(tmp_path, raw_dsn)
    project.write_models(MODELS)
    project.autogenerate("fences")
    script = project.alembic("upgrade", "head", "--sql").stdout
    with project.connect() as conn:
        conn.execute("DROP TABLE IF EXISTS alembic_version")  # autogenerate made it
    path = project.root / "upgrade.sql"
    path.write_text(script)
    psql = client_bin("psql", project.server_version_num)
    env = {**os.environ, "PGOPTIONS": "-c standard_conforming_strings=off"}
    run = subprocess.run(
        [psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(path), project.dsn],
        capture_output=True,
        text=True,
        env=env,
    )
    assert run.returncode == 0, run.stderr
    with project.connect() as conn:
        got = conn.execute("SELECT table_name, resource FROM fencekit.protected").fetchall()
    assert got == [("o'b\\rien\\", "r\\'1")]


@pytest.mark.parametrize("body", ["a$fn", "$fn$", "x$fn$fn1$ $fn", "plain"])
def test_dollar_quote_ends_where_the_body_ends(db: psycopg.Connection[Any], body: str) -> None:
    """The tag is chosen so that its first occurrence after the opening one is the closing
    one: a body ending in ``$fn`` would otherwise end the quote early."""
    from fencekit.sqlgen.text import dollar

    got = db.execute(f"SELECT {dollar(body, 'fn')}".encode()).fetchone()
    assert got == (body,)
