"""Rollout mode's cost: a write without a token beside the same write with one.

Under ``on_missing = allow`` (rolling fencing out: every existing writer still writes without a
token) each tokenless statement is judged, counted as ``unfenced`` and attributed to its writer
(``fencekit rollout``) once, by its check; a row fence's rows then pass their triggers' WHEN
clauses. This measures what that costs, interleaved in small batches so both sides of a ratio
see the same machine load:

- one-row transactions of the same shape (set ``fencekit.token``, empty or a token; UPDATE one
  row; COMMIT) on the same table, tokenless against the same holder's token, for each scope;
  then the same while another session holds 1,000 locks (the cost of an unfenced write must
  not depend on what other sessions do);
- bulk: one UPDATE of every row, tokenless against the token, for each scope;
- eight connections writing one table without a token at once, with attribution against the
  same protection without it (its ``fencekit.attribute`` calls left out): recording must not
  become a hot row that serializes writers;
- a write with a token on a table in rollout mode against the same write on a table that
  rejects tokenless writes: a write with a token pays nothing for attribution.

One-row and bulk ratios are of wall time, with the ratio of the backend's CPU per transaction
in the name where the server runs on this machine.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql

from fencekit.bench.results import ratio_result, server_cpu_ns
from fencekit.spec import FenceSpec, Scope, TableName
from fencekit.sqlgen import protect_statements, unprotect_statements

__all__ = ["run"]

SCHEMA = "fencekit_bench_rollout"
ROWS = 1000
TOKEN = "4242"

_TABLE = """
CREATE TABLE {t} (
  id          bigint PRIMARY KEY,
  account_id  bigint NOT NULL,
  total       numeric(12, 2) NOT NULL DEFAULT 0,
  status      text NOT NULL DEFAULT 'open',
  payload     jsonb NOT NULL DEFAULT '{{}}',
  updated_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO {t} (id, account_id, payload)
SELECT g, g % 100, jsonb_build_object('note', repeat('x', 60)) FROM generate_series(1, {rows}) g;
"""


@contextmanager
def _schema(conn: psycopg.Connection[Any]) -> Iterator[None]:
    def drop() -> None:
        # Unprotect first: dropping a protected table would leave its fences and counters.
        for (spec,) in conn.execute(
            "SELECT spec FROM fencekit.protected WHERE schema_name = %s", [SCHEMA]
        ).fetchall():
            for stmt in unprotect_statements(FenceSpec.from_dict(spec)):
                conn.execute(stmt)
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))

    drop()
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(SCHEMA)))
    try:
        yield
    finally:
        drop()


def _table(
    conn: psycopg.Connection[Any], name: str, spec: FenceSpec | None, *, attributed: bool = True
) -> str:
    t = f"{SCHEMA}.{name}"
    conn.execute(_TABLE.format(t=t, rows=ROWS))
    if spec is not None:
        for stmt in protect_statements(spec):
            conn.execute(stmt if attributed else _without_attribution(stmt))
    return t


def _without_attribution(stmt: str) -> str:
    """The same protection with its attribution left out (the block sqlgen's ``attribute()``
    writes: the inline test and its ``fencekit.attribute`` call): the baseline of what
    attribution costs (an empty ELSE branch is valid PL/pgSQL)."""
    return re.sub(
        r"\n *IF \(pg_catalog\.current_setting\('fencekit\.seen_.*?\n *END IF;",
        "",
        stmt,
        flags=re.S,
    )


def _specs() -> list[tuple[str, FenceSpec]]:
    out = []
    for scope in (Scope.ROW, Scope.KEY, Scope.TABLE):
        key = ("account_id",) if scope is Scope.KEY else ()
        spec = FenceSpec(TableName(SCHEMA, "x"), scope=scope, key=key, on_missing="allow")
        out.append((scope.value, spec))
    return out


def _named(spec: FenceSpec, name: str, **changes: Any) -> FenceSpec:
    d = spec.as_dict()
    d.update(changes)
    d["table"] = {"schema": SCHEMA, "name": name}
    return FenceSpec.from_dict(d)


def _tables(conn: psycopg.Connection[Any]) -> list[tuple[str, str]]:
    """(label, table) for each scope under on_missing=allow."""
    out = []
    for scope in (Scope.ROW, Scope.KEY, Scope.TABLE):
        name = f"allow_{scope.value}"
        key = ("account_id",) if scope is Scope.KEY else ()
        spec = FenceSpec(TableName(SCHEMA, name), scope=scope, key=key, on_missing="allow")
        out.append((f"{scope.value} fence", _table(conn, name, spec)))
    for _, t in out:
        conn.execute(f"VACUUM ANALYZE {t}")
    return out


@contextmanager
def _locks_held(dsn: str, n: int) -> Iterator[None]:
    """Another session holding ``n`` locks (advisory: they sit in the shared lock table, which
    pg_locks reads in full) for as long as the block runs."""
    with psycopg.connect(dsn) as other:
        other.execute("SELECT pg_advisory_xact_lock(g) FROM generate_series(1, %s) g", [n])
        try:
            yield
        finally:
            other.rollback()


def _measure(
    conn: psycopg.Connection[Any],
    tables: list[tuple[str, str]],
    transactions: int,
    rounds: int,
    progress: Callable[[str], None],
    what: str,
) -> Figures:
    """Seconds per one-row transaction, one figure per batch, per (label, setting). Same shape
    both ways: set the setting (a token, or empty), UPDATE, COMMIT. Each table's two batches
    run back to back, so that the i-th figures of both sides saw the same machine load (these
    machines are shared and noisy); the tables rotate."""
    sides = []
    for label, t in tables:
        sides += [(f"{label}|{TOKEN}", t, TOKEN), (f"{label}|", t, "")]
    return _one_row(conn, sides, transactions, rounds, progress, what)


Figures = tuple[dict[str, list[float]], dict[str, list[float]]]


def _one_row(
    conn: psycopg.Connection[Any],
    sides: list[tuple[str, str, str]],
    transactions: int,
    rounds: int,
    progress: Callable[[str], None],
    what: str,
) -> Figures:
    """Wall seconds and server CPU seconds (the backend's, when the server runs on this
    machine; else none) per one-row transaction of each (name, table, token) side, one figure
    per batch: set the setting (a token, or empty), UPDATE, COMMIT. Pairs of sides run back to
    back, in alternating order, so the i-th figures of both saw the same machine load; pairs
    rotate."""
    wall: dict[str, list[float]] = {name: [] for name, _, _ in sides}
    cpu: dict[str, list[float]] = {name: [] for name, _, _ in sides}
    pairs = [sides[i : i + 2] for i in range(0, len(sides), 2)]
    pid = conn.info.backend_pid
    batch = 20
    for r in range(rounds):
        progress(f"{what}: round {r + 1}/{rounds}")
        for b in range(transactions // batch):
            k = b % len(pairs)
            for pair in pairs[k:] + pairs[:k]:
                for name, t, tok in pair if b % 2 else pair[::-1]:
                    stmt = f"UPDATE {t} SET total = total + 1, updated_at = now() WHERE id = %s"
                    server = server_cpu_ns(pid)
                    start = time.perf_counter()
                    for i in range(batch):
                        with conn.transaction():
                            conn.execute("SELECT set_config('fencekit.token', %s, true)", [tok])
                            conn.execute(stmt, [(b * batch + i) % ROWS + 1])
                    wall[name].append((time.perf_counter() - start) / batch)
                    if server:
                        cpu[name].append((server_cpu_ns(pid) - server) / 1e9 / batch)
    return wall, cpu


def _ratio(figures: Figures, name: str, base: str, other: str, target: str) -> dict[str, Any]:
    """``other`` against ``base`` in wall time per transaction (what the writer waits), with
    the ratio of the backend's CPU per transaction in the name where the server runs on this
    machine (what the write costs the server, free of the commit's flush and of other
    processes on a shared machine)."""
    wall, cpu = figures
    if cpu[base] and len(cpu[base]) == len(cpu[other]):
        spent = ratio_result(name, cpu[base], cpu[other], "s", target)
        name = f"{name} (server CPU {spent['ratio']:.2f}x)"
    return ratio_result(name, wall[base], wall[other], "s", target)


def _interleaved(
    conn: psycopg.Connection[Any],
    sides: list[tuple[str, str, str]],
    rounds: int,
    progress: Callable[[str], None],
    what: str,
) -> Figures:
    """Wall and server CPU seconds per transaction of each (name, table, token) side running
    ``UPDATE every row``; one figure per round, the sides' order alternating round by round."""
    wall: dict[str, list[float]] = {name: [] for name, _, _ in sides}
    cpu: dict[str, list[float]] = {name: [] for name, _, _ in sides}
    pid = conn.info.backend_pid
    for r in range(rounds):
        progress(f"{what}: round {r + 1}/{rounds}")
        for name, t, tok in sides if r % 2 else sides[::-1]:
            server = server_cpu_ns(pid)
            start = time.perf_counter()
            with conn.transaction():
                conn.execute("SELECT set_config('fencekit.token', %s, true)", [tok])
                conn.execute(f"UPDATE {t} SET total = total + 1, updated_at = now()")
            wall[name].append(time.perf_counter() - start)
            if server:
                cpu[name].append((server_cpu_ns(pid) - server) / 1e9)
    return wall, cpu


def _open_writers(dsn: str, t: str, n: int) -> list[psycopg.Connection[Any]]:
    """``n`` connections that write ``t`` without a token, each warmed by one write (a pooled
    application's connections: PL/pgSQL compiled, the statement attributed once)."""
    conns = []
    for _ in range(n):
        c = psycopg.connect(dsn, autocommit=True)
        c.execute("SET application_name = 'fencekit-bench-writer'")
        c.execute(f"UPDATE {t} SET total = total + 1, updated_at = now() WHERE id = %s", [1])
        conns.append(c)
    return conns


def _writers(conns: list[psycopg.Connection[Any]], t: str, seconds: float) -> tuple[float, float]:
    """Tokenless one-row transactions per second of ``conns`` writing ``t`` at once, each its
    own rows (a writer's row is never another's: only fencekit could serialize them), and
    their backends' CPU seconds per transaction (0 when the server is not on this machine)."""
    n = len(conns)
    done = [0] * n
    start_line = threading.Barrier(n + 1)
    stop = threading.Event()
    pids = [c.info.backend_pid for c in conns]

    def writer(i: int) -> None:
        c = conns[i]
        stmt = f"UPDATE {t} SET total = total + 1, updated_at = now() WHERE id = %s"
        rows = [r for r in range(1, ROWS + 1) if r % n == i]
        start_line.wait()
        k = 0
        while not stop.is_set():
            with c.transaction():
                c.execute(stmt, [rows[k % len(rows)]])
            k += 1
        done[i] = k

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    server = [server_cpu_ns(pid) for pid in pids]
    start_line.wait()
    began = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - began
    spent = sum(server_cpu_ns(pid) - s for pid, s in zip(pids, server, strict=True))
    total = max(sum(done), 1)
    return sum(done) / elapsed, (spent / 1e9 / total if all(server) else 0.0)


def _concurrent(
    conn: psycopg.Connection[Any],
    dsn: str,
    rounds: int,
    seconds: float,
    progress: Callable[[str], None],
) -> list[dict[str, Any]]:
    """Eight tokenless writers of one table, with attribution against without, per scope:
    many short rounds, the sides alternating, so that the median of the per-round ratios
    outlasts the load other processes put on a shared machine for a second or two. The name
    carries the ratio of the eight backends' CPU per transaction: at saturation (eight
    backends and eight client threads on a few cores) throughput follows it."""
    results = []
    for label, spec in _specs():
        with_t = _table(conn, f"eight_{label}", _named(spec, f"eight_{label}"))
        without_t = _table(
            conn, f"eight_{label}_plain", _named(spec, f"eight_{label}_plain"), attributed=False
        )
        conn.execute(f"VACUUM ANALYZE {with_t}")
        conn.execute(f"VACUUM ANALYZE {without_t}")
        on: list[float] = []
        off: list[float] = []
        on_cpu: list[float] = []
        off_cpu: list[float] = []
        with_conns = _open_writers(dsn, with_t, 8)
        without_conns = _open_writers(dsn, without_t, 8)
        try:
            for r in range(rounds):
                progress(f"eight tokenless writers, {label} fence: round {r + 1}/{rounds}")
                sides = [
                    (with_t, with_conns, on, on_cpu),
                    (without_t, without_conns, off, off_cpu),
                ]
                for t, conns, out, cpu in sides if r % 2 else sides[::-1]:
                    rate, spent = _writers(conns, t, seconds)
                    out.append(rate)
                    cpu.append(spent)
        finally:
            for c in with_conns + without_conns:
                c.close()
        name = (
            f"{label} fence, on_missing=allow: eight connections writing without a token, "
            "transactions per second with attribution vs without"
        )
        if all(on_cpu) and all(off_cpu):
            cpu_ratio = ratio_result(name, off_cpu, on_cpu, "s", "-")["ratio"]
            name = f"{name} (server CPU {cpu_ratio:.2f}x)"
        # Throughput: the ratio is attributed / not attributed (higher is better).
        results.append(ratio_result(name, off, on, "tx/s", ">= 0.90x"))
    return results


def run(
    dsn: str, *, quick: bool = False, progress: Callable[[str], None] = lambda _: None
) -> list[dict[str, Any]]:
    """Ratios per scope: tokenless against token one-row transactions (idle, and with 1,000
    locks held elsewhere) and bulk UPDATEs (seconds, tokenless / token); a token's write on a
    table in rollout mode against one that rejects tokenless writes; eight tokenless writers
    with attribution against without (transactions per second)."""
    transactions = 200 if quick else 1000
    rounds = 3 if quick else 5
    results: list[dict[str, Any]] = []
    with psycopg.connect(dsn, autocommit=True) as conn, _schema(conn):
        tables = _tables(conn)
        rejecting = [
            (
                f"{label}, on_missing=reject",
                _table(
                    conn, f"reject_{label}", _named(spec, f"reject_{label}", on_missing="reject")
                ),
            )
            for label, spec in _specs()
        ]
        with conn.transaction():  # the holder's first write on each table
            conn.execute("SELECT set_config('fencekit.token', %s, true)", [TOKEN])
            for _, t in tables + rejecting:
                conn.execute(f"UPDATE {t} SET total = total")
        for held in (0, 1000):
            what = "idle server" if not held else f"another session holding {held:,} locks"
            if held:
                with _locks_held(dsn, held):
                    seconds = _measure(conn, tables, transactions, rounds, progress, what)
            else:
                seconds = _measure(conn, tables, transactions, rounds, progress, what)
            for label, _ in tables:
                results.append(
                    _ratio(
                        seconds,
                        f"{label}, on_missing=allow: one-row transaction without a token vs "
                        f"with one ({what})",
                        f"{label}|{TOKEN}",
                        f"{label}|",
                        "<= 1.10x",
                    )
                )
        # A write with a token pays nothing for attribution: rollout mode against reject.
        for (label, t), (_, rt) in zip(tables, rejecting, strict=True):
            sides = [(f"{label}|allow", t, TOKEN), (f"{label}|reject", rt, TOKEN)]
            seconds = _one_row(conn, sides, transactions, rounds, progress, f"{label} with a token")
            results.append(
                _ratio(
                    seconds,
                    f"{label}: one-row transaction with a token, on_missing=allow vs reject",
                    f"{label}|reject",
                    f"{label}|allow",
                    "<= 1.02x",
                )
            )
        # Attribution's own cost: the same tokenless write with and without it.
        for label, spec in _specs():
            plain = _table(conn, f"plain_{label}", _named(spec, f"plain_{label}"), attributed=False)
            t = f"{SCHEMA}.allow_{label}"
            sides = [(f"{label}|plain", plain, ""), (f"{label}|attributed", t, "")]
            seconds = _one_row(
                conn, sides, transactions, rounds, progress, f"{label} fence, attribution"
            )
            results.append(
                _ratio(
                    seconds,
                    f"{label} fence, on_missing=allow: one-row transaction without a token, "
                    "with attribution vs without",
                    f"{label}|plain",
                    f"{label}|attributed",
                    "-",
                )
            )
        bulk_rounds = 6 if quick else 20
        for label, t in tables:
            sides = [(f"{label}|{TOKEN}", t, TOKEN), (f"{label}|", t, "")]
            seconds = _interleaved(conn, sides, bulk_rounds, progress, f"bulk, {label}")
            results.append(
                _ratio(
                    seconds,
                    f"{label}, on_missing=allow: UPDATE of {ROWS:,} rows without a token vs "
                    "with one",
                    f"{label}|{TOKEN}",
                    f"{label}|",
                    "<= 1.10x",
                )
            )
        # Twenty-four rounds: on a shared machine the per-round ratios spread by +-10%, and the
        # median of twelve still moved by the few points that decide the target.
        results += _concurrent(conn, dsn, 4 if quick else 24, 0.5 if quick else 1.0, progress)
    return results
