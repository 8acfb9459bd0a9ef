"""A deliberately broken issuer, for tests only: the checker must fail a run that uses it.

It wraps fencekit's PostgreSQL issuer. When the resource is held by someone else, it grants it
anyway half of the time, handing back the token of the live holder (the highest token written
to the register so far): two holders at once, sharing one token. Workers load it with
``--issuer-factory tests.chaos.broken_issuer:make`` (``ChaosConfig.issuer_factory``).
"""

from __future__ import annotations

import argparse
import random
from typing import Any

import psycopg

from fencekit.leases import Grant, PostgresIssuer

BROKEN = "broken-postgres"


class BrokenIssuer:
    name = BROKEN

    def __init__(self, args: argparse.Namespace) -> None:
        self.inner = PostgresIssuer(args.dsn, timeout=2, prepare_threshold=None)
        self.dsn = args.dsn
        self.conn: psycopg.Connection[Any] | None = None
        self.rng = random.Random(f"broken:{args.name}")

    def _live_token(self, resource: str) -> int | None:
        if self.conn is None or self.conn.closed or self.conn.broken:
            self.conn = psycopg.connect(self.dsn, autocommit=True, prepare_threshold=None)
        key = resource.split(":", 1)[1]
        row = self.conn.execute(
            "SELECT max(token) FROM chaos_log WHERE resource = %s", (key,)
        ).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def try_acquire(self, resource: str, holder: str, ttl: float) -> Grant | None:
        grant = self.inner.try_acquire(resource, holder, ttl)
        if grant is not None or self.rng.random() < 0.5:
            return grant
        token = self._live_token(resource)  # the bug: the live holder's token, again
        return None if token is None else Grant(resource, holder, token, ttl, BROKEN)

    def renew(self, grant: Grant) -> bool:
        return True if grant.issuer == BROKEN else self.inner.renew(grant)

    def release(self, grant: Grant) -> None:
        if grant.issuer != BROKEN:
            self.inner.release(grant)

    def close(self) -> None:
        self.inner.close()
        if self.conn is not None:
            self.conn.close()


def make(args: argparse.Namespace) -> BrokenIssuer:
    return BrokenIssuer(args)
