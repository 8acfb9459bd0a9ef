"""Core benchmarks: the cost of fencing inside PostgreSQL, as ratios measured side by side.

Each case runs the same statement on a protected table and on an identical unprotected twin,
interleaved round by round (these machines are shared and noisy), and reports the ratio of the
medians. Nothing here asserts on time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql

from fencekit.bench.results import ratio_result
from fencekit.spec import FenceSpec, Scope, TableName
from fencekit.sqlgen import protect_statements, unprotect_statements

__all__ = ["run"]

SCHEMA = "fencekit_bench"

# A realistic row: a billing summary with a few typed columns, a jsonb payload and a secondary
# index. The "narrow" shape (id, account, integer) shows the worst case: the cheaper the write,
# the larger the share of the trigger.
_SHAPES = {
    "billing": """
        CREATE TABLE {t} (
          id          bigint PRIMARY KEY,
          account_id  bigint NOT NULL,
          period      date NOT NULL DEFAULT current_date,
          total       numeric(12, 2) NOT NULL DEFAULT 0,
          currency    char(3) NOT NULL DEFAULT 'EUR',
          line_items  integer NOT NULL DEFAULT 0,
          status      text NOT NULL DEFAULT 'open',
          payload     jsonb NOT NULL DEFAULT '{{}}',
          updated_at  timestamptz NOT NULL DEFAULT now()
        );
        CREATE INDEX ON {t} (account_id);
        INSERT INTO {t} (id, account_id, payload)
        SELECT g, g % {keys}, jsonb_build_object('lines', g % 17, 'note', repeat('x', 120))
          FROM generate_series(1, {rows}) g;
    """,
    "narrow": """
        CREATE TABLE {t} (id bigint PRIMARY KEY, account_id bigint NOT NULL, v integer NOT NULL);
        INSERT INTO {t} SELECT g, g % {keys}, 0 FROM generate_series(1, {rows}) g;
    """,
}
_UPDATE = {
    "billing": "UPDATE {t} SET total = total + 1, updated_at = now()",
    "narrow": "UPDATE {t} SET v = v + 1",
}


def _drop_bench_schema(conn: psycopg.Connection[Any]) -> None:
    # Unprotect first: dropping a protected table would leave its fences and counters behind.
    rows = conn.execute(
        "SELECT spec FROM fencekit.protected WHERE schema_name = %s", [SCHEMA]
    ).fetchall()
    for (spec,) in rows:
        for stmt in unprotect_statements(FenceSpec.from_dict(spec)):
            conn.execute(stmt)
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))


@contextmanager
def _bench_schema(conn: psycopg.Connection[Any]) -> Iterator[None]:
    _drop_bench_schema(conn)
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(SCHEMA)))
    try:
        yield
    finally:
        _drop_bench_schema(conn)


def _make_table(
    conn: psycopg.Connection[Any],
    name: str,
    shape: str,
    rows: int,
    keys: int,
    spec: FenceSpec | None,
) -> str:
    t = f"{SCHEMA}.{name}"
    conn.execute(_SHAPES[shape].format(t=t, rows=rows, keys=keys))
    if spec is not None:
        for stmt in protect_statements(spec):
            conn.execute(stmt)
    conn.execute(f"VACUUM ANALYZE {t}")
    return t


def _timed_tx(conn: psycopg.Connection[Any], token: int | None, statement: str) -> float:
    with conn.transaction():
        if token is not None:
            conn.execute("SELECT set_config('fencekit.token', %s, true)", [str(token)])
        start = time.perf_counter()
        conn.execute(statement)
        elapsed = time.perf_counter() - start
    return elapsed


def _bulk(
    conn: psycopg.Connection[Any],
    shape: str,
    rows: int,
    rounds: int,
    progress: Callable[[str], None],
) -> list[dict[str, Any]]:
    plain = _make_table(conn, f"{shape}_plain", shape, rows, 1000, None)
    row = _make_table(
        conn, f"{shape}_row", shape, rows, 1000, FenceSpec(TableName(SCHEMA, f"{shape}_row"))
    )
    key = _make_table(
        conn,
        f"{shape}_key",
        shape,
        rows,
        1000,
        FenceSpec(TableName(SCHEMA, f"{shape}_key"), scope=Scope.KEY, key=("account_id",)),
    )
    times: dict[str, list[float]] = {
        k: [] for k in ("plain_new", "plain_same", "row_new", "row_same", "key_new")
    }
    token = 1000
    for r in range(rounds):
        progress(f"bulk {shape}: round {r + 1}/{rounds}")
        token += 1
        for name, t in (("plain", plain), ("row", row), ("key", key)):
            conn.execute(f"VACUUM {t}")  # same heap state for every variant, outside the timing
            times.setdefault(f"{name}_new", []).append(
                _timed_tx(conn, token, _UPDATE[shape].format(t=t))
            )
            if name != "key":
                conn.execute(f"VACUUM {t}")
                times[f"{name}_same"].append(_timed_tx(conn, token, _UPDATE[shape].format(t=t)))
    n = f"{rows:,} rows, {shape} table"
    return [
        ratio_result(
            f"row fence, bulk UPDATE, new token ({n})",
            times["plain_new"],
            times["row_new"],
            "s",
            "<= 1.15x",
        ),
        ratio_result(
            f"row fence, bulk UPDATE, same token ({n})",
            times["plain_same"],
            times["row_same"],
            "s",
            "<= 1.05x",
        ),
        ratio_result(
            f"key fence, bulk UPDATE, 1,000 keys ({n})",
            times["plain_new"],
            times["key_new"],
            "s",
            "<= 1.3x",
        ),
    ]


# The least a key fence can cost in its design (an AFTER STATEMENT trigger reading the keys the
# statement wrote from its transition tables, one fence row per key): each floor adds one step,
# hand-written, with no checks at all, so a key fence's ratio can be read against them.
_KEY_FLOOR_FUNCTIONS = f"""
CREATE FUNCTION {SCHEMA}.after_noop() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RETURN NULL; END $$;
CREATE FUNCTION {SCHEMA}.after_keys() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE keys text[];
BEGIN
  SELECT array_agg(k.account_id::text) INTO keys
    FROM (SELECT account_id FROM fencekit_new UNION SELECT account_id FROM fencekit_old) AS k;
  RETURN NULL;
END $$;
CREATE TABLE {SCHEMA}.floor_fences (key text PRIMARY KEY, fence bigint NOT NULL);
CREATE FUNCTION {SCHEMA}.after_upsert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO {SCHEMA}.floor_fences AS f (key, fence)
  SELECT DISTINCT k.account_id::text, current_setting('fencekit.token')::bigint
    FROM (SELECT account_id FROM fencekit_new UNION SELECT account_id FROM fencekit_old) AS k
  ON CONFLICT (key) DO UPDATE SET fence = excluded.fence WHERE f.fence < excluded.fence;
  RETURN NULL;
END $$;
"""
_KEY_FLOORS = (
    ("key floor: an empty AFTER STATEMENT trigger with transition tables", "after_noop"),
    ("key floor: + reading the statement's keys", "after_keys"),
    ("key floor: + one upsert of their fences (no checks)", "after_upsert"),
)


def _single_row(
    conn: psycopg.Connection[Any],
    transactions: int,
    rounds: int,
    progress: Callable[[str], None],
    *,
    synchronous_commit: bool = True,
) -> list[dict[str, Any]]:
    """One-row transactions (set token, UPDATE one row, COMMIT) on a row fence, a key fence and
    the key fence's floors, each against the same plain table, interleaved in small batches."""
    suffix = "" if synchronous_commit else "_async"
    plain = _make_table(conn, f"single_plain{suffix}", "billing", 1000, 100, None)
    tables: list[tuple[str, str, str]] = [
        (
            "row fence",
            _make_table(
                conn,
                f"single_row{suffix}",
                "billing",
                1000,
                100,
                FenceSpec(TableName(SCHEMA, f"single_row{suffix}")),
            ),
            ">= 0.95x",
        ),
        (
            "key fence (account_id)",
            _make_table(
                conn,
                f"single_key{suffix}",
                "billing",
                1000,
                100,
                FenceSpec(
                    TableName(SCHEMA, f"single_key{suffix}"), scope=Scope.KEY, key=("account_id",)
                ),
            ),
            ">= 0.85x" if synchronous_commit else ">= 0.77x",
        ),
    ]
    if conn.execute(
        "SELECT to_regprocedure(%s) IS NULL", [f"{SCHEMA}.after_noop()"]
    ).fetchone() == (True,):
        conn.execute(_KEY_FLOOR_FUNCTIONS)
    for i, (label, function) in enumerate(_KEY_FLOORS):
        t = _make_table(conn, f"single_floor{i}{suffix}", "billing", 1000, 100, None)
        conn.execute(
            f"CREATE TRIGGER t AFTER UPDATE ON {t} REFERENCING OLD TABLE AS fencekit_old "
            f"NEW TABLE AS fencekit_new FOR EACH STATEMENT EXECUTE FUNCTION {SCHEMA}.{function}()"
        )
        tables.append((label, t, "-"))
    names = ["plain", *(label for label, _, _ in tables)]
    table_of = {"plain": plain, **{label: t for label, t, _ in tables}}
    seconds: dict[str, list[float]] = {name: [] for name in names}
    token = 10_000
    batch = 25
    conn.execute(f"SET synchronous_commit = {'on' if synchronous_commit else 'off'}")
    try:
        for r in range(rounds):
            progress(
                f"single-row transactions{'' if synchronous_commit else ' (sync off)'}: "
                f"round {r + 1}/{rounds}"
            )
            token += 1
            spent = dict.fromkeys(names, 0.0)
            # Rotate small batches so that every table sees the same machine load.
            for b in range(transactions // batch):
                for name in names[b % len(names) :] + names[: b % len(names)]:
                    stmt = (
                        f"UPDATE {table_of[name]} SET total = total + 1, updated_at = now() "
                        "WHERE id = %s"
                    )
                    start = time.perf_counter()
                    for i in range(batch):
                        # Same shape everywhere: set the token, update one row, commit.
                        with conn.transaction():
                            conn.execute(
                                "SELECT set_config('fencekit.token', %s, true)", [str(token)]
                            )
                            conn.execute(stmt, [(b * batch + i) % 1000 + 1])
                    spent[name] += time.perf_counter() - start
            for name in names:
                seconds[name].append(spent[name])
    finally:
        conn.execute("RESET synchronous_commit")
    n = (transactions // batch) * batch
    mode = "" if synchronous_commit else ", synchronous_commit off"
    out = []
    for label, _, target in tables:
        # Throughput ratio = fenced rate / plain rate = plain time / fenced time, per round.
        ratios = [p / f for p, f in zip(seconds["plain"], seconds[label], strict=True)]
        out.append(
            {
                "name": f"{label}, single-row transactions (set token, UPDATE, COMMIT{mode})",
                "baseline": n / statistics.median(seconds["plain"]),
                "fenced": n / statistics.median(seconds[label]),
                "ratio": statistics.median(ratios),
                "unit": "tx/s",
                "target": target,
            }
        )
    return out


# Where the time of a row fence goes: each variant adds one thing to the one before it, all on
# the billing table, all updating every row under a new token (the fence changes on every row).
_ANATOMY_FUNCTIONS = f"""
CREATE FUNCTION {SCHEMA}.noop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$;
CREATE FUNCTION {SCHEMA}.assign() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  NEW.fencekit_fence := pg_catalog.current_setting('fencekit.token', true)::pg_catalog.int8;
  RETURN NEW;
END $$;
"""
_ANATOMY = (
    (
        "any BEFORE ROW trigger (WHEN false: the row is fetched and locked for it)",
        "CREATE TRIGGER t BEFORE UPDATE ON {t} FOR EACH ROW WHEN (false) "
        f"EXECUTE FUNCTION {SCHEMA}.noop()",
    ),
    (
        "an empty PL/pgSQL row trigger (the per-row call)",
        f"CREATE TRIGGER t BEFORE UPDATE ON {{t}} FOR EACH ROW EXECUTE FUNCTION {SCHEMA}.noop()",
    ),
    (
        "PL/pgSQL reading the setting into the fence column (no checks)",
        f"CREATE TRIGGER t BEFORE UPDATE ON {{t}} FOR EACH ROW EXECUTE FUNCTION {SCHEMA}.assign()",
    ),
)


def _anatomy(
    conn: psycopg.Connection[Any], rows: int, rounds: int, progress: Callable[[str], None]
) -> list[dict[str, Any]]:
    conn.execute(_ANATOMY_FUNCTIONS)
    plain = _make_table(conn, "anat_plain", "billing", rows, 1000, None)
    conn.execute(f"ALTER TABLE {plain} ADD COLUMN fencekit_fence bigint")
    tables: list[tuple[str, str]] = []
    for i, (label, ddl) in enumerate(_ANATOMY):
        t = _make_table(conn, f"anat_{i}", "billing", rows, 1000, None)
        conn.execute(f"ALTER TABLE {t} ADD COLUMN fencekit_fence bigint")
        conn.execute(ddl.format(t=t))
        tables.append((label, t))
    t = _make_table(conn, "anat_fk", "billing", rows, 1000, FenceSpec(TableName(SCHEMA, "anat_fk")))
    tables.append(("fencekit row fence", t))
    times: dict[str, list[float]] = {t: [] for t in [plain, *(t for _, t in tables)]}
    token = 50_000
    update = _UPDATE["billing"]
    for r in range(rounds):
        progress(f"row fence anatomy: round {r + 1}/{rounds}")
        token += 1
        for t in times:
            conn.execute(f"VACUUM {t}")
            times[t].append(_timed_tx(conn, token, update.format(t=t)))
    return [
        ratio_result(
            f"anatomy: {label} ({rows:,} rows, new token)", times[plain], times[t], "s", "-"
        )
        for label, t in tables
    ]


def run(
    dsn: str, *, quick: bool = False, progress: Callable[[str], None] = lambda _: None
) -> list[dict[str, Any]]:
    """Run the core benchmarks against ``dsn`` (a database with fencekit's core installed)."""
    rows = 20_000 if quick else 100_000
    rounds = 3 if quick else 7
    with psycopg.connect(dsn, autocommit=True) as conn, _bench_schema(conn):
        results = _bulk(conn, "billing", rows, rounds, progress)
        results += _bulk(conn, "narrow", rows, rounds, progress)
        single = 300 if quick else 2000
        results += _single_row(conn, single, rounds, progress)
        results += _single_row(conn, single, rounds, progress, synchronous_commit=False)
        results += _anatomy(conn, rows, rounds, progress)
    return results
