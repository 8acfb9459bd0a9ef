"""Core benchmarks: the cost of fencing inside PostgreSQL, as ratios measured side by side.

Each case runs the same statement on a protected table and on an identical unprotected twin,
interleaved round by round (these machines are shared and noisy), and reports the ratio of the
medians. Nothing here asserts on time.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql

from fencekit.bench.results import ratio_result
from fencekit.spec import FenceSpec, Scope, TableName
from fencekit.sqlgen import protect_statements, unprotect_statements

__all__: list[str] = []

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
    """Bulk UPDATE of every row, new token then the same token again, on: a plain table; the
    same with a fence column and the conditional UPDATE a user writes without fencekit
    (``SET ..., fence = :token WHERE fence <= :token``); a row fence; a key fence (1,000
    keys)."""
    plain = _make_table(conn, f"{shape}_plain", shape, rows, 1000, None)
    hand = _make_table(conn, f"{shape}_hand", shape, rows, 1000, None)
    conn.execute(f"ALTER TABLE {hand} ADD COLUMN fence bigint NOT NULL DEFAULT 0")
    conn.execute(f"VACUUM ANALYZE {hand}")

    def fenced(name: str, scope: Scope = Scope.ROW) -> str:
        key = ("account_id",) if scope is Scope.KEY else ()
        spec = FenceSpec(TableName(SCHEMA, f"{shape}_{name}"), scope=scope, key=key)
        return _make_table(conn, f"{shape}_{name}", shape, rows, 1000, spec)

    row, key = fenced("row"), fenced("key", Scope.KEY)
    update = _UPDATE[shape]
    variants = {
        "plain": (plain, update),
        "hand": (hand, update + ", fence = {tok} WHERE fence <= {tok}"),
        "row": (row, update),
        "key": (key, update),
    }
    times: dict[str, list[float]] = {}
    token = 1000
    for r in range(rounds):
        progress(f"bulk {shape}: round {r + 1}/{rounds}")
        token += 1
        for when in ("new", "same"):  # the same token twice: a holder writing again
            for name, (t, stmt) in variants.items():
                conn.execute(f"VACUUM {t}")  # same heap state for every variant, untimed
                times.setdefault(f"{name}_{when}", []).append(
                    _timed_tx(conn, token, stmt.format(t=t, tok=token))
                )
    n = f"{rows:,} rows, {shape} table"

    def ratio(label: str, base: str, other: str, target: str) -> dict[str, Any]:
        return ratio_result(f"{label} ({n})", times[base], times[other], "s", target)

    return [
        ratio("row fence, bulk UPDATE, new token", "plain_new", "row_new", "<= 1.15x"),
        ratio("row fence, bulk UPDATE, same token", "plain_same", "row_same", "<= 1.05x"),
        ratio("hand-written conditional UPDATE (no fencekit)", "plain_new", "hand_new", "-"),
        ratio("row fence, bulk UPDATE vs the hand-written one", "hand_new", "row_new", "-"),
        ratio("key fence, bulk UPDATE, 1,000 keys, new token", "plain_new", "key_new", "<= 1.3x"),
        ratio(
            "key fence, bulk UPDATE, 1,000 keys, same token", "plain_same", "key_same", "<= 1.3x"
        ),
        ratio("key fence, bulk UPDATE, same token vs new token", "key_new", "key_same", "<= 1.0x"),
    ]


# The least a key fence can cost in its design, hand-written with no checks at all: an AFTER
# STATEMENT trigger with transition tables (empty); that trigger reading the statement's keys
# and share-locking their fence rows, the one thing a key fence must do for a write under the
# current token (know its keys; hold their fences against an advance until commit); and the
# design floor itself, the same as SECURITY DEFINER with a pinned search_path, as it must run
# to touch fencekit.fences, which writers may not. Everything a key fence adds beyond it
# (reading and validating the token, the settings that fix a key's text, the NULL, lease,
# issuer and bypass checks) is the price of its guarantees; the ratio against the floor
# shows it.
_KEY_FLOOR_FUNCTIONS = f"""
CREATE FUNCTION {SCHEMA}.after_noop() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RETURN NULL; END $$;
CREATE TABLE {SCHEMA}.floor_fences (key text PRIMARY KEY, fence bigint NOT NULL);
INSERT INTO {SCHEMA}.floor_fences SELECT g::text, 1 FROM generate_series(0, 99) g;
CREATE FUNCTION {SCHEMA}.after_lock() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM FROM {SCHEMA}.floor_fences f
   WHERE f.key IN (SELECT account_id::text FROM fencekit_new
                   UNION SELECT account_id::text FROM fencekit_old)
   ORDER BY f.key FOR SHARE;
  RETURN NULL;
END $$;
"""
_KEY_FLOOR_FUNCTIONS += f"""
CREATE FUNCTION {SCHEMA}.after_lock_definer() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM FROM {SCHEMA}.floor_fences f
   WHERE f.key IN (SELECT account_id::text FROM fencekit_new
                   UNION SELECT account_id::text FROM fencekit_old)
   ORDER BY f.key FOR SHARE;
  RETURN NULL;
END $$;
"""
# The least a row fence can cost in its design, hand-written with no checks: a statement
# trigger that copies the token into a transaction-local setting (the row fence's one read of
# the token per statement) and a row trigger that writes it into the fence column (the one
# thing a row fence must do for a write under a new token). Everything a row fence adds beyond
# it (the token's form, the comparison with the row's old fence, bypass, counting) is the
# price of its guarantees.
_ROW_FLOOR_FUNCTIONS = f"""
CREATE FUNCTION {SCHEMA}.row_floor_stmt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM set_config('fencekit_bench.checked',
                     COALESCE(current_setting('fencekit.token', true), ''), true);
  RETURN NULL;
END $$;
CREATE FUNCTION {SCHEMA}.row_floor_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  NEW.fence := current_setting('fencekit_bench.checked')::bigint;
  RETURN NEW;
END $$;
"""
_ROW_FLOOR = "row floor (design): a statement trigger and a row trigger copying the token"
_KEY_FLOORS = (
    ("key floor: an empty AFTER STATEMENT trigger with transition tables", "after_noop"),
    ("key floor: + reading the keys and share-locking their fences", "after_lock"),
    (
        "key floor (design): + as SECURITY DEFINER with a pinned search_path",
        "after_lock_definer",
    ),
)
_DESIGN_FLOOR = _KEY_FLOORS[-1][0]


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
            ">= 0.90x" if synchronous_commit else "-",
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
        conn.execute(_KEY_FLOOR_FUNCTIONS + _ROW_FLOOR_FUNCTIONS)
    row_floor = _make_table(conn, f"single_row_floor{suffix}", "billing", 1000, 100, None)
    conn.execute(
        f"ALTER TABLE {row_floor} ADD COLUMN fence bigint; "
        f"CREATE TRIGGER s BEFORE UPDATE ON {row_floor} FOR EACH STATEMENT "
        f"EXECUTE FUNCTION {SCHEMA}.row_floor_stmt(); "
        f"CREATE TRIGGER r BEFORE UPDATE ON {row_floor} FOR EACH ROW "
        f"EXECUTE FUNCTION {SCHEMA}.row_floor_row()"
    )
    tables.insert(1, (_ROW_FLOOR, row_floor, "-"))
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

    def throughput(name: str, base: str, label: str, target: str) -> dict[str, Any]:
        # Throughput ratio = fenced rate / base rate = base time / fenced time, per round.
        ratios = [p / f for p, f in zip(seconds[base], seconds[label], strict=True)]
        return {
            "name": name,
            "baseline": n / statistics.median(seconds[base]),
            "fenced": n / statistics.median(seconds[label]),
            "ratio": statistics.median(ratios),
            "unit": "tx/s",
            "target": target,
        }

    out = [
        throughput(
            f"{label}, single-row transactions (set token, UPDATE, COMMIT{mode})",
            "plain",
            label,
            target,
        )
        for label, _, target in tables
    ]
    out.append(
        throughput(
            f"row fence against its design floor, single-row transactions{mode}",
            _ROW_FLOOR,
            "row fence",
            "-",
        )
    )
    out.append(
        throughput(
            f"key fence against its design floor, single-row transactions{mode}",
            _DESIGN_FLOOR,
            "key fence (account_id)",
            ">= 0.92x" if synchronous_commit else "-",
        )
    )
    return out


def _drive(dsn: str, table: str, workers: int, seconds: float) -> tuple[int, int]:
    """``workers`` connections, each committing one-row UPDATEs of its own rows under token 7
    for ``seconds``: (transactions committed, errors)."""
    conns = [psycopg.connect(dsn, autocommit=True) for _ in range(workers)]
    done = [0] * workers
    errors = [0] * workers
    start = threading.Barrier(workers + 1)
    stop = threading.Event()

    def work(w: int) -> None:
        conn = conns[w]
        stmt = f"UPDATE {table} SET total = total + 1, updated_at = now() WHERE id = %s"
        start.wait()
        i = 0
        while not stop.is_set():
            i += 1
            try:
                with conn.transaction():
                    conn.execute("SELECT set_config('fencekit.token', '7', true)")
                    conn.execute(stmt, [w * 100 + i % 100 + 1])
                done[w] += 1
            except psycopg.Error:
                errors[w] += 1

    threads = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    start.wait()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    for c in conns:
        c.close()
    return sum(done), sum(errors)


def _same_token_pool(
    conn: psycopg.Connection[Any],
    dsn: str,
    rounds: int,
    seconds: float,
    progress: Callable[[str], None],
    workers: int = 8,
) -> list[dict[str, Any]]:
    """One holder, eight connections, all writing different rows of ONE key under the same
    token (a worker with a thread pool): throughput against the same load on a plain table."""
    plain = _make_table(conn, "pool_plain", "billing", workers * 100, 1, None)
    key = _make_table(
        conn,
        "pool_key",
        "billing",
        workers * 100,
        1,  # every row under one key
        FenceSpec(TableName(SCHEMA, "pool_key"), scope=Scope.KEY, key=("account_id",)),
    )
    # The same load with a key per connection: nothing shared, so the difference between the
    # two fenced tables is what sharing one fence row costs, apart from the fence's CPU.
    apart = _make_table(conn, "pool_apart", "billing", workers * 100, 1, None)
    conn.execute(f"UPDATE {apart} SET account_id = (id - 1) / 100")
    for stmt in protect_statements(
        FenceSpec(TableName(SCHEMA, "pool_apart"), scope=Scope.KEY, key=("account_id",))
    ):
        conn.execute(stmt)
    for t in (key, apart):  # the holder's first writes
        _timed_tx(conn, 7, f"UPDATE {t} SET total = total WHERE id % 100 = 1")
    rates: dict[str, list[float]] = {plain: [], key: [], apart: []}
    errors = dict.fromkeys(rates, 0)
    for r in range(rounds):
        progress(f"same-token pool, {workers} connections: round {r + 1}/{rounds}")
        order = [plain, key, apart]
        for t in order[r % 3 :] + order[: r % 3]:
            n, bad = _drive(dsn, t, workers, seconds)
            rates[t].append(n / seconds)
            errors[t] += bad
    return [
        ratio_result(
            f"key fence, {workers} connections, same token, one key (errors: plain "
            f"{errors[plain]}, fenced {errors[key]})",
            rates[plain],
            rates[key],
            "tx/s",
            ">= 0.85x",
        ),
        ratio_result(
            f"key fence, {workers} connections, same token, a key each (errors: {errors[apart]})",
            rates[plain],
            rates[apart],
            "tx/s",
            "-",
        ),
        ratio_result(
            f"key fence, {workers} connections: one shared key against a key each",
            rates[apart],
            rates[key],
            "tx/s",
            "-",
        ),
    ]


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
    rows = 10_000 if quick else 100_000
    rounds = 3 if quick else 7
    with psycopg.connect(dsn, autocommit=True) as conn, _bench_schema(conn):
        results = _bulk(conn, "billing", rows, rounds, progress)
        results += _bulk(conn, "narrow", rows, rounds, progress)
        single = 200 if quick else 2000
        results += _single_row(conn, single, rounds, progress)
        results += _single_row(conn, single, rounds, progress, synchronous_commit=False)
        results += _same_token_pool(conn, dsn, rounds, 1.0 if quick else 3.0, progress)
        results += _anatomy(conn, rows, rounds, progress)
    return results
