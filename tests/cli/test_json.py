"""``--json`` on install, protect, unprotect and rename; ``fencekit --version`` with ``--dsn``;
``--dsn`` accepts SQLAlchemy URLs. The keys are documented in
docs/reference.md."""

from __future__ import annotations

import json
import re
from typing import Any

from fencekit import __version__, sqlgen
from fencekit.cli.common import libpq_dsn

from .conftest import Cli
from .test_unprotect_exact import _run

TABLE_KEYS = {"action", "table", "schema", "name", "spec", "template_version"}


def _url(dsn: str, driver: str = "+psycopg") -> str:
    """The key=value DSN the fixtures give, as a SQLAlchemy URL."""
    parts = dict(p.split("=", 1) for p in dsn.split())
    return (
        f"postgresql{driver}://{parts['user']}@/{parts['dbname']}"
        f"?host={parts['host']}&port={parts['port']}"
    )


def test_install_protect_unprotect_json(cli: Cli, raw_dsn: str) -> None:
    r = cli("install", "--json", "--dsn", raw_dsn)
    assert r.code == 0, r.err
    doc: dict[str, Any] = json.loads(r.out)
    assert doc == {
        "action": "install",
        "core_version_before": None,
        "core_version": sqlgen.CORE_VERSION,
        "template_version": sqlgen.TEMPLATE_VERSION,
        "reprotected": [],
    }
    _run(raw_dsn, "CREATE TABLE t (id int NOT NULL)")
    r = cli("protect", "t", "--key", "id", "--json", "--dsn", raw_dsn)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert set(doc) == TABLE_KEYS | {"notes", "owner_code", "allowed"}
    assert (doc["action"], doc["table"], doc["spec"]["key"]) == ("protect", "public.t", ["id"])
    assert (doc["owner_code"], doc["allowed"]) == ([], {})
    _run(raw_dsn, "ALTER TABLE t RENAME TO u")
    r = cli("rename", "t", "u", "--json", "--dsn", raw_dsn)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert set(doc) == TABLE_KEYS | {"old"}
    assert (doc["old"]["table"], doc["table"]) == ("public.t", "public.u")
    r = cli("unprotect", "u", "--json", "--dsn", raw_dsn)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert set(doc) == TABLE_KEYS
    assert doc["action"] == "unprotect"


def test_sqlalchemy_urls_are_accepted(cli: Cli, dsn: str) -> None:
    for driver in ("+psycopg", "+psycopg2", ""):
        r = cli("status", "--dsn", _url(dsn, driver))
        assert r.code == 0, r.err
    r = cli("status", "--dsn", "mysql+pymysql://u@h/db")
    assert r.code == 2
    assert "is not a PostgreSQL URL" in r.err
    assert libpq_dsn("postgres://h/db") == "postgresql://h/db"
    assert libpq_dsn("host=/tmp dbname=x") == "host=/tmp dbname=x"


def test_version_with_a_dsn(cli: Cli, dsn: str) -> None:
    plain = cli("--version")
    assert plain.code == 0
    assert plain.out.strip() == f"fencekit {__version__}"
    _run(dsn, "CREATE TABLE t (id int NOT NULL)", "CREATE TABLE u (id int NOT NULL)")
    for t in ("t", "u"):
        assert cli("protect", t, "--dsn", dsn).code == 0
    r = cli("--version", "--dsn", _url(dsn))
    assert r.code == 0, r.err
    assert r.out.splitlines() == [
        f"fencekit {__version__} (core {sqlgen.CORE_VERSION}, table template "
        f"{sqlgen.TEMPLATE_VERSION})",
        f"database: core {sqlgen.CORE_VERSION}; template {sqlgen.TEMPLATE_VERSION}: 2 table(s)",
    ]
    r = cli("--version", "--json", "--dsn", dsn)
    doc = json.loads(r.out)
    assert doc == {
        "package": __version__,
        "core_version": sqlgen.CORE_VERSION,
        "template_version": sqlgen.TEMPLATE_VERSION,
        "database": {
            "core_version": sqlgen.CORE_VERSION,
            "templates": {str(sqlgen.TEMPLATE_VERSION): 2},
        },
    }


def test_version_without_fencekit_installed(cli: Cli, raw_dsn: str) -> None:
    r = cli("--version", "--dsn", raw_dsn)
    assert r.code == 0, r.err
    assert r.out.splitlines()[1] == "database: fencekit is not installed"
    bad = cli("--version", "--dsn", "host=/nonexistent port=1")
    assert bad.code == 1
    assert re.match(r"fencekit --version: error: ", bad.err)
