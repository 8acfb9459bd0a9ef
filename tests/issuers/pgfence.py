"""The fenced PostgreSQL side of the issuer tests: the counter table the workers write, protected
with a key fence on a named resource bound to an issuer (FenceSpec(..., issuer=...))."""

from __future__ import annotations

from typing import Any

import psycopg

from fencekit.spec import FenceSpec, Scope, TableName
from fencekit.sqlgen import protect_statements

RESOURCE = "jobs"  # the named resource of the key fence


def counter_spec(issuer: str | None, table: str = "counter", resource: str = RESOURCE) -> FenceSpec:
    return FenceSpec(
        table=TableName("public", table),
        scope=Scope.KEY,
        key=("id",),
        resource=resource,
        issuer=issuer,
    )


def make_counter(
    db: psycopg.Connection[Any],
    issuer: str | None,
    *,
    fenced: bool = True,
    table: str = "counter",
    resource: str = RESOURCE,
) -> None:
    """``<table>(id, value)`` with row id 1 = 0, fenced (or not), plus the unfenced ``writes``."""
    db.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, value int NOT NULL)")
    db.execute(f"INSERT INTO {table} VALUES (1, 0)")
    db.execute(
        "CREATE TABLE IF NOT EXISTS writes "
        "(id serial PRIMARY KEY, worker text NOT NULL, token bigint NOT NULL, value int NOT NULL)"
    )
    if fenced:
        for stmt in protect_statements(counter_spec(issuer, table, resource)):
            db.execute(stmt.encode())  # type: ignore[call-overload]
    db.commit()


def state(dsn: str) -> tuple[int, list[tuple[str, int, int]], dict[str, int]]:
    """(counter value, accepted writes in commit order, rejection counts by reason)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT value FROM counter WHERE id = 1").fetchone()
        assert row is not None
        writes = [
            (str(w), int(t), int(v))
            for w, t, v in conn.execute("SELECT worker, token, value FROM writes ORDER BY id")
        ]
        rejections = {
            str(reason): int(count)
            for reason, count in conn.execute(
                "SELECT reason, sum(count) FROM fencekit.rejections "
                "WHERE table_name = 'counter' GROUP BY reason"
            )
        }
    return int(row[0]), writes, rejections
