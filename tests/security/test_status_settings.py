"""``status`` reports what makes sessions skip or forge the token check, however it is spelled:

- a role or database default of ``session_replication_role = replica`` (no trigger fires in
  those sessions, fencekit's included);
- a fencekit.token, or session_replication_role = replica, in a foreign server's or user
  mapping's libpq ``options``, read the way the server reads them: it drops each backslash
  (``-c fencekit.tok\\en=9000`` sets fencekit.token), takes ``--name=value``, ``-cname=value``
  and switches bundled before ``c``, and folds a name's case and dashes.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from fencekit.catalog.model import DriftKind
from fencekit.catalog.settings import backend_settings, setting_drift, split_options

Conn = psycopg.Connection[Any]


def _drift(db: Conn) -> list[tuple[str, str]]:
    db.rollback()
    got = [(d.kind.value, d.object) for d in setting_drift(db)]
    db.rollback()
    return got


@pytest.mark.parametrize(
    ("ddl", "where"),
    [
        ("ALTER ROLE srr_app SET session_replication_role = replica", "role srr_app"),
        ("ALTER ROLE srr_app SET session_replication_role = 'REPLICA'", "role srr_app"),
        ("ALTER DATABASE {db} SET session_replication_role = replica", "database {db}"),
        (
            "ALTER ROLE srr_app IN DATABASE {db} SET session_replication_role = replica",
            "role srr_app in database {db}",
        ),
    ],
)
def test_a_default_of_session_replication_role_replica_is_reported(
    db: Conn, ddl: str, where: str
) -> None:
    name = db.info.dbname
    db.execute("CREATE ROLE srr_app")
    db.commit()
    assert _drift(db) == []
    try:
        db.execute(ddl.format(db=name))
        db.commit()
        (d,) = setting_drift(db)
        db.rollback()
        assert (d.kind, d.object) == (DriftKind.REPLICATION_ROLE_DEFAULT, where.format(db=name))
        assert "no trigger fires" in d.message
        db.execute(d.fix)  # the RESET it prints
        db.commit()
        assert _drift(db) == []
    finally:
        db.rollback()
        db.execute(f"ALTER DATABASE {name} RESET ALL")
        db.execute("DROP ROLE srr_app")
        db.commit()
    # 'local' and 'origin' fire the triggers: nothing to report.
    db.execute(f"ALTER DATABASE {name} SET session_replication_role = local")
    db.commit()
    assert _drift(db) == []
    db.execute(f"ALTER DATABASE {name} RESET ALL")
    db.commit()


SPELLINGS = [
    r"-c fencekit.tok\en=9000",
    r"-c fencekit\.token\=9000",
    "-cfencekit.token=9000",
    "--fencekit.token=9000",
    "-c FENCEKIT.TOKEN=9000",
    "-ec fencekit.token=9000",
    r"-c application_name=x  -c fence\kit\.\token=9000",
    "-c session_replication_role=replica",
    "--session-replication-role=REPLICA",
    r"-c session_replication_role=rep\lica",
]


@pytest.mark.parametrize("options", SPELLINGS)
def test_foreign_options_are_read_as_the_server_reads_them(db: Conn, options: str) -> None:
    db.execute("CREATE FOREIGN DATA WRAPPER fk_wrapper")
    db.execute("CREATE SERVER quiet FOREIGN DATA WRAPPER fk_wrapper OPTIONS (host 'x')")
    db.execute("CREATE SERVER elsewhere FOREIGN DATA WRAPPER fk_wrapper OPTIONS (options %s)"
               .replace("%s", psycopg.sql.quote(options)))  # fmt: skip
    db.execute("CREATE USER MAPPING FOR PUBLIC SERVER quiet OPTIONS (options %s)"
               .replace("%s", psycopg.sql.quote(options)))  # fmt: skip
    db.commit()
    assert sorted(_drift(db)) == [
        ("token_setting", "foreign server elsewhere"),
        ("token_setting", "user mapping public on server quiet"),
    ]


def test_harmless_options_are_not_reported(db: Conn) -> None:
    db.execute("CREATE FOREIGN DATA WRAPPER fk_wrapper")
    db.execute(
        "CREATE SERVER elsewhere FOREIGN DATA WRAPPER fk_wrapper "
        r"OPTIONS (options '-c session_replication_role=local -c fencekit.tokens=1')"
    )
    db.commit()
    assert _drift(db) == []


def test_split_and_read_like_the_server() -> None:
    assert split_options(r"  -c a=b\ c\\d   -c\ x=1 ") == ["-c", r"a=b c\d", "-c x=1"]
    assert backend_settings(r"-c fencekit.tok\en=9000") == [("fencekit.token", "9000")]
    assert backend_settings("-B 10 -c a-b=1 -Fc x=2 --y-z=3 -cw=4 stray") == [
        ("a_b", "1"),
        ("x", "2"),
        ("y_z", "3"),
        ("w", "4"),
    ]
