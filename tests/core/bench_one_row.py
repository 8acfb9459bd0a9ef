"""One-row transactions on each fence beside plain and beside their floors: interleaved
transaction by transaction, wall time and CPU (client and server) per transaction.

    .venv/bin/python -m tests.core.bench_one_row [--dsn DSN] [--tx N] [--rounds R]

Each variant has its own connection (so each backend's CPU is its own, read from /proc when the
server runs on this machine); a round runs N transactions per variant, taking turns one
transaction at a time. A transaction is what an application sends: set the token, UPDATE one
row, COMMIT, with synchronous_commit on. Printed: per variant the median over rounds of
transactions per second, and the ratio to plain (and, for the fences, to their floor), wall
and CPU. Floors: the least a design can cost in PL/pgSQL, hand-written with no checks:

- row floor: a BEFORE ROW PL/pgSQL trigger that returns NEW;
- row floor + statement: the same plus a BEFORE STATEMENT PL/pgSQL trigger that does nothing
  (the row fence's shape: a statement check and a row check);
- row design floor: the row fence's data flow and nothing else, in PL/pgSQL: a statement
  trigger that copies the token into a transaction-local setting, and a row trigger that writes
  it into the fence column (no validation, no comparison with the old fence, no counting; no
  WHEN clause, which PostgreSQL would parse again on every statement);
- key design floor: an AFTER STATEMENT trigger with transition tables that reads the keys and
  share-locks their fence rows, SECURITY DEFINER with a pinned search_path;
- key floor, advancing: the same, which raises the key's fence row (an upsert) when it does not
  hold the token yet. Each round has a new token, so a round's first write of each key advances
  its fence (with the default 2,000 transactions over 1,000 rows, half the writes): the least a
  key fence must do for those is write the fence row, which the design floor never does.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import psycopg

from fencekit import sqlgen
from fencekit.spec import FenceSpec, Scope, TableName

S = "bench_one_row"
ROWS = 1000

SETUP = f"""
DROP SCHEMA IF EXISTS {S} CASCADE;
CREATE SCHEMA {S};
CREATE FUNCTION {S}.row_noop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$;
CREATE FUNCTION {S}.stmt_noop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE FUNCTION {S}.row_design_stmt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM set_config('bench_one_row.checked',
                     COALESCE(current_setting('fencekit.token', true), ''), true);
  RETURN NULL;
END $$;
CREATE FUNCTION {S}.row_design_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  NEW.fence := current_setting('bench_one_row.checked')::bigint;
  RETURN NEW;
END $$;
CREATE TABLE {S}.floor_fences (key text PRIMARY KEY, fence bigint NOT NULL);
INSERT INTO {S}.floor_fences SELECT g::text, 1 FROM generate_series(1, {ROWS}) g;
CREATE FUNCTION {S}.key_floor() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM FROM {S}.floor_fences f
   WHERE f.key IN (SELECT account_id::text FROM fencekit_new
                   UNION SELECT account_id::text FROM fencekit_old)
   ORDER BY f.key FOR SHARE;
  RETURN NULL;
END $$;
CREATE TABLE {S}.adv_fences (key text PRIMARY KEY, fence bigint NOT NULL);
INSERT INTO {S}.adv_fences SELECT g::text, 1 FROM generate_series(1, {ROWS}) g;
CREATE FUNCTION {S}.key_floor_adv() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  tok bigint := current_setting('fencekit.token')::bigint;
  k text := (SELECT account_id::text FROM fencekit_new);  -- one row
BEGIN
  PERFORM FROM {S}.adv_fences f WHERE f.key = k AND f.fence = tok FOR SHARE;
  IF NOT FOUND THEN
    INSERT INTO {S}.adv_fences AS f VALUES (k, tok)
    ON CONFLICT (key) DO UPDATE SET fence = tok WHERE f.fence < tok;
  END IF;
  RETURN NULL;
END $$;
"""

VARIANTS: dict[str, str] = {
    "plain": "",
    "row fence": "row",
    "row floor": "CREATE TRIGGER r BEFORE UPDATE ON {t} FOR EACH ROW "
    f"EXECUTE FUNCTION {S}.row_noop()",
    "row floor + statement": "CREATE TRIGGER r BEFORE UPDATE ON {t} "
    f"FOR EACH ROW EXECUTE FUNCTION {S}.row_noop(); "
    "CREATE TRIGGER s BEFORE UPDATE ON {t} "
    f"FOR EACH STATEMENT EXECUTE FUNCTION {S}.stmt_noop()",
    "row design floor": "ALTER TABLE {t} ADD COLUMN fence bigint; "
    "CREATE TRIGGER s BEFORE UPDATE ON {t} "
    f"FOR EACH STATEMENT EXECUTE FUNCTION {S}.row_design_stmt(); "
    "CREATE TRIGGER r BEFORE UPDATE ON {t} FOR EACH ROW "
    f"EXECUTE FUNCTION {S}.row_design_row()",
    "key fence": "key",
    "key design floor": "CREATE TRIGGER k AFTER UPDATE ON {t} "
    "REFERENCING OLD TABLE AS fencekit_old NEW TABLE AS fencekit_new "
    f"FOR EACH STATEMENT EXECUTE FUNCTION {S}.key_floor()",
    "key floor, advancing": "CREATE TRIGGER k AFTER UPDATE ON {t} "
    "REFERENCING OLD TABLE AS fencekit_old NEW TABLE AS fencekit_new "
    f"FOR EACH STATEMENT EXECUTE FUNCTION {S}.key_floor_adv()",
}
FLOOR = {"row fence": "row floor", "key fence": "key design floor"}
# Floors printed beside the fence they bound from below, with the fence's ratio to each.
MORE_FLOORS = {"key fence": "key floor, advancing", "row fence": "row design floor"}


def _table(name: str) -> str:
    return f"{S}.t_" + name.replace(" + ", "_").replace(", ", "_").replace(" ", "_")


def setup(conn: psycopg.Connection[Any]) -> None:
    conn.execute(SETUP)
    for name, how in VARIANTS.items():
        t = _table(name)
        conn.execute(
            f"CREATE TABLE {t} (id int PRIMARY KEY, account_id int NOT NULL, total bigint, "
            "updated_at timestamptz)"
        )
        conn.execute(f"INSERT INTO {t} SELECT g, g, 0, now() FROM generate_series(1, {ROWS}) g")
        if how in ("row", "key"):
            spec = FenceSpec(
                TableName(S, t.split(".")[1]),
                scope=Scope(how),
                key=("account_id",) if how == "key" else (),
            )
            for stmt in sqlgen.protect_statements(spec):
                conn.execute(stmt.encode())
        elif how:
            conn.execute(how.replace("{t}", t))
    conn.execute("VACUUM ANALYZE")


def _server_cpu(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(dsn: str, tx: int, rounds: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as admin:
        setup(admin)
    conns = {name: psycopg.connect(dsn, autocommit=True) for name in VARIANTS}
    pids = {name: c.info.backend_pid for name, c in conns.items()}
    wall: dict[str, list[float]] = {n: [] for n in VARIANTS}
    client: dict[str, list[float]] = {n: [] for n in VARIANTS}
    server: dict[str, list[float]] = {n: [] for n in VARIANTS}
    stmts = {
        n: f"UPDATE {_table(n)} SET total = total + 1, updated_at = now() WHERE id = %s"
        for n in VARIANTS
    }
    names = list(VARIANTS)
    token = 10_000
    try:
        for c in conns.values():
            c.execute("SET synchronous_commit = on")
        for r in range(rounds + 1):  # round 0 warms up
            token += 1
            w = dict.fromkeys(names, 0.0)
            cl = dict.fromkeys(names, 0.0)
            sv0 = {n: _server_cpu(pids[n]) for n in names}
            for i in range(tx):
                row = i % ROWS + 1
                turn = names[i % len(names) :] + names[: i % len(names)]
                for n in turn:
                    c = conns[n]
                    t0, c0 = time.perf_counter(), time.thread_time()
                    with c.transaction():
                        c.execute("SELECT set_config('fencekit.token', %s, true)", [str(token)])
                        c.execute(stmts[n], [row])
                    cl[n] += time.thread_time() - c0
                    w[n] += time.perf_counter() - t0
            if r == 0:
                continue
            for n in names:
                wall[n].append(w[n])
                client[n].append(cl[n])
                a, b = sv0[n], _server_cpu(pids[n])
                if a is not None and b is not None:
                    server[n].append(b - a)
    finally:
        for c in conns.values():
            c.close()
        with psycopg.connect(dsn, autocommit=True) as admin:
            for stmt in sqlgen.unprotect_statements(
                FenceSpec(TableName(S, _table("row fence").split(".")[1]))
            ):
                admin.execute(stmt.encode())
            for stmt in sqlgen.unprotect_statements(
                FenceSpec(
                    TableName(S, _table("key fence").split(".")[1]),
                    scope=Scope.KEY,
                    key=("account_id",),
                )
            ):
                admin.execute(stmt.encode())
            admin.execute(f"DROP SCHEMA {S} CASCADE")

    def ratio(xs: list[float], ys: list[float]) -> float:
        """Throughput of y against x: x's time over y's, per round, median."""
        return statistics.median(a / b for a, b in zip(xs, ys, strict=True))

    print(f"{tx} one-row transactions per variant per round, {rounds} rounds, interleaved; "
          f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"{'variant':24} {'tx/s':>8} {'wall vs plain':>14} {'CPU vs plain':>13} "
          f"{'us CPU/tx (client+server)':>27}")  # fmt: skip
    for n in names:
        cpu = [a + b for a, b in zip(client[n], server[n], strict=False)] or client[n]
        base_cpu = [a + b for a, b in zip(client["plain"], server["plain"], strict=False)]
        print(
            f"{n:24} {tx / statistics.median(wall[n]):8.0f} "
            f"{ratio(wall['plain'], wall[n]):13.3f}x "
            f"{ratio(base_cpu or client['plain'], cpu):12.3f}x "
            f"{statistics.median(client[n]) / tx * 1e6:12.1f} + "
            f"{(statistics.median(server[n]) / tx * 1e6) if server[n] else float('nan'):.1f}"
        )
    for n, f in [*FLOOR.items(), *MORE_FLOORS.items()]:
        print(
            f"{n} vs {f}: wall {ratio(wall[f], wall[n]):.3f}x "
            f"({f} vs plain: wall {ratio(wall['plain'], wall[f]):.3f}x)"
        )
    print(f"row floor vs plain: wall {ratio(wall['plain'], wall['row floor']):.3f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", help="a database with fencekit's core (default: embedded)")
    p.add_argument("--tx", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    if args.dsn:
        run(args.dsn, args.tx, args.rounds)
        return
    from fencekit.embedded import start_embedded

    srv = start_embedded()
    try:
        from psycopg.conninfo import make_conninfo

        with psycopg.connect(srv.dsn, autocommit=True) as c:
            c.execute("DROP DATABASE IF EXISTS bench_one_row")
            c.execute("CREATE DATABASE bench_one_row")
        dsn = make_conninfo(srv.dsn, dbname="bench_one_row")
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(sqlgen.render_install().encode())
        run(dsn, args.tx, args.rounds)
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
