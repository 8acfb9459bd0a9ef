"""Adapter benchmarks: what carrying the token costs, as users feel it, per adapter.

Each adapter's one-row transaction (``UPDATE ... WHERE id = $1`` on a row-fenced table) is
measured three ways, all on the same driver, interleaved transaction by transaction (the order
of the sides rotates every transaction, so each sees the same machine):

- **vs the same driver unfenced**: the same UPDATE on an identical unprotected table;
- **vs the least cost**: the same fenced UPDATE with the token sent by hand as one ``SET
  LOCAL`` in the BEGIN's query, and no fencekit code on the client: what any token carrier
  must at least spend on this fence;
- **vs a hand-written conditional UPDATE**: ``... SET fence = $t WHERE id = $1 AND fence <=
  $t`` on a table without triggers, the fencing an application writes by hand.

Beside these, **the floor**: the least cost inside the application's ``with fencing(token):``
scope, with the token read back from it and formatted into the BEGIN (:func:`fencekit.wire.
scope_value`, :func:`fencekit.wire.set_local`): what any adapter that takes the token from the
scope must spend at least. On asyncpg, whose one hook is the connection's class, the floor
also goes through a minimal subclass whose ``execute()`` does only that. Its ratio to the least
cost is the best an adapter can reach.

Per side: wall time, client CPU (this thread's) and server CPU (the backend's, from
``/proc/<pid>/schedstat`` when the server runs on this machine; 0 when it does not) per
transaction, each the median over rounds. The ratio is the other side's CPU per transaction
over the adapter's (client plus server; higher is better): the target is >= 0.95x of the least
cost. Round trips per transaction are counted through a protocol proxy (client-to-server
bursts after a server reply). Nothing here asserts on time.
"""

from __future__ import annotations

import itertools
import socket
import statistics
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from fencekit import psycopg as fk_psycopg
from fencekit import wire
from fencekit.bench.results import server_cpu_ns
from fencekit.context import fencing
from fencekit.spec import FenceSpec, TableName
from fencekit.sqlgen import protect_statements, unprotect_statements

__all__ = ["run"]

SCHEMA = "fencekit_bench_adapters"
ROWS = 1000

_TABLE = """
CREATE TABLE {t} (
  id         bigint PRIMARY KEY,
  account_id bigint NOT NULL,
  total      numeric(12, 2) NOT NULL DEFAULT 0,
  updated_at timestamptz NOT NULL DEFAULT now(),
  fence      bigint NOT NULL DEFAULT 0
);
INSERT INTO {t} (id, account_id) SELECT g, g % 100 FROM generate_series(1, {rows}) g;
"""

_UPDATE = "UPDATE {schema}.{table} SET total = total + 1, updated_at = now() WHERE id = {row}"
_CONDITIONAL = (
    "UPDATE {schema}.conditional SET total = total + 1, updated_at = now(), fence = {token} "
    "WHERE id = {row} AND fence <= {token}"
)

Work = Callable[[int, int], None]  # (row id, token) -> one transaction
_LOCK_TIMEOUT = "20s"


@dataclass
class Side:
    work: Work
    pid: int  # the backend that runs it (its CPU is the server side)


Sides = dict[str, Side]  # "unfenced", "least", "floor", "conditional", "adapter"
Builder = Callable[[str, ExitStack], Sides]


def _setup(conn: psycopg.Connection[Any]) -> None:
    _teardown(conn)
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(SCHEMA)))
    for name in ("plain", "fenced", "conditional"):
        conn.execute(_TABLE.format(t=f"{SCHEMA}.{name}", rows=ROWS).encode())
    with conn.transaction():
        conn.execute("SELECT set_config('fencekit.token', '1', true)")
        for stmt in protect_statements(FenceSpec(TableName(SCHEMA, "fenced"))):
            conn.execute(stmt.encode())
    conn.execute(f"VACUUM ANALYZE {SCHEMA}.plain, {SCHEMA}.fenced, {SCHEMA}.conditional".encode())


def _teardown(conn: psycopg.Connection[Any]) -> None:
    exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", [f"{SCHEMA}.fenced"]).fetchone()
    if exists and exists[0]:
        for stmt in unprotect_statements(FenceSpec(TableName(SCHEMA, "fenced"))):
            conn.execute(stmt.encode())
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))


def _sql(table: str, param: str) -> str:
    return _UPDATE.format(schema=SCHEMA, table=table, row=param)


def _least(token: int) -> bytes:
    return f"BEGIN; SET LOCAL fencekit.token = '{token:d}'".encode()


def _floor() -> bytes:
    """The least cost's BEGIN, built from the current scope (inside ``with fencing(...)``)."""
    value = wire.scope_value()
    assert value is not None  # the floor side runs inside its scope
    return b"BEGIN; " + wire.set_local(value, True).encode()


def _cond(param_row: str, param_token: str) -> str:
    return _CONDITIONAL.format(schema=SCHEMA, row=param_row, token=param_token)


# ---------------------------------------------------------------- measuring


# Tokens only grow across the whole run: every case writes the same fenced rows.
_tokens = itertools.count(int(time.time()))


def _measure(sides: Sides, transactions: int, rounds: int) -> dict[str, dict[str, float]]:
    """Per side: wall, client and server seconds per transaction (medians over rounds).

    Each side runs on a connection, so a backend, of its own: a backend that serves several
    sides stays warmer in the CPU caches than one serving a single side, and was measured
    spending up to 15% less server CPU on the same statements."""
    names = list(sides)
    for i in range(20):  # warm up: prepared statements, caches
        token = next(_tokens)
        for name in names:
            sides[name].work(i + 1, token)
    per_round = max(1, transactions // rounds)
    samples: dict[str, dict[str, list[float]]] = {
        n: {"wall": [], "client": [], "server": []} for n in names
    }
    row = 0
    for _ in range(rounds):
        spent = {n: [0, 0, 0] for n in names}
        for i in range(per_round):
            token = next(_tokens)
            row = row % ROWS + 1
            shift = i % len(names)
            for name in names[shift:] + names[:shift]:
                side = sides[name]
                s0, c0, w0 = server_cpu_ns(side.pid), time.thread_time_ns(), time.perf_counter_ns()
                side.work(row, token)
                w1, c1 = time.perf_counter_ns(), time.thread_time_ns()
                s1 = server_cpu_ns(side.pid)
                total = spent[name]
                total[0] += w1 - w0
                total[1] += c1 - c0
                total[2] += s1 - s0
        for name, (wall, client, server) in spent.items():
            samples[name]["wall"].append(wall / 1e9 / per_round)
            samples[name]["client"].append(client / 1e9 / per_round)
            samples[name]["server"].append(server / 1e9 / per_round)
    return {n: {k: statistics.median(v) for k, v in kinds.items()} for n, kinds in samples.items()}


class _TripCounter:
    """A TCP proxy in front of the server that counts round trips: each burst the client
    sends after the server last spoke is one."""

    def __init__(self, dsn: str) -> None:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
        host = str(params.get("host") or "localhost")
        port = int(str(params.get("port") or 5432))
        self._target: Any = f"{host}/.s.PGSQL.{port}" if host.startswith("/") else (host, port)
        self._family = socket.AF_UNIX if host.startswith("/") else socket.AF_INET
        self.trips = 0
        self._last = "server"
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.dsn = psycopg.conninfo.make_conninfo(
            dsn,
            host="127.0.0.1",
            port=str(self._listener.getsockname()[1]),
            sslmode="disable",
            gssencmode="disable",
            connect_timeout="10",
        )
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.socket(self._family, socket.SOCK_STREAM)
            try:
                upstream.connect(self._target)
            except OSError:
                client.close()  # the client sees the connection fail, not a hang
                upstream.close()
                continue
            for src, dst, who in ((client, upstream, "client"), (upstream, client, "server")):
                threading.Thread(target=self._pump, args=(src, dst, who), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, who: str) -> None:
        try:
            while data := src.recv(65536):
                with self._lock:
                    if who == "client" and self._last == "server":
                        self.trips += 1
                    self._last = who
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._listener.close()


def _trips(build: Builder, counter: _TripCounter, n: int = 10) -> dict[str, float]:
    """Round trips per transaction of each side, on connections through the proxy."""
    out: dict[str, float] = {}
    with ExitStack() as stack:
        sides = build(counter.dsn, stack)
        for name, side in sides.items():
            side.work(1, next(_tokens))  # warm: nothing left of connecting or preparing
            before = counter.trips
            for i in range(n):
                side.work(i + 1, next(_tokens))
            out[name] = (counter.trips - before) / n
    return out


# ---------------------------------------------------------------- the adapters, side by side


def _pid(conn: psycopg.Connection[Any]) -> int:
    return int(conn.pgconn.backend_pid)


def _psycopg(dsn: str, stack: ExitStack, *, automatic: bool) -> Sides:
    # Every side on a connection of its own (see _measure): autocommit with transaction() for
    # the baselines; install() on one not in autocommit mode, as an application's pool gives it.
    def connect(**kwargs: Any) -> psycopg.Connection[Any]:
        return stack.enter_context(psycopg.connect(dsn, **kwargs))

    u, lc, fl, co, ex = (connect(autocommit=True) for _ in range(5))
    installed = connect()
    plain, fenced = _sql("plain", "%s"), _sql("fenced", "%s")
    cond = _cond("%s", "%s")

    def unfenced(row: int, token: int) -> None:
        with u.transaction():
            u.execute(plain, (row,))

    def least(row: int, token: int) -> None:
        lc.execute(_least(token))
        lc.execute(fenced, (row,))
        lc.execute(b"COMMIT")

    def floor(row: int, token: int) -> None:
        with fencing(token):
            fl.execute(_floor())
            fl.execute(fenced, (row,))
            fl.execute(b"COMMIT")

    def conditional(row: int, token: int) -> None:
        with co.transaction():
            co.execute(cond, (token, row, token))

    def explicit(row: int, token: int) -> None:
        with fk_psycopg.transaction(ex, token):
            ex.execute(fenced, (row,))

    fk_psycopg.install(installed)

    def scoped(row: int, token: int) -> None:  # the implicit BEGIN: how SQLAlchemy begins
        with fencing(token):
            installed.execute(fenced, (row,))
            installed.commit()

    adapter = Side(scoped, _pid(installed)) if automatic else Side(explicit, _pid(ex))
    return {
        "unfenced": Side(unfenced, _pid(u)),
        "least": Side(least, _pid(lc)),
        "floor": Side(floor, _pid(fl)),
        "conditional": Side(conditional, _pid(co)),
        "adapter": adapter,
    }


def _psycopg2(dsn: str, stack: ExitStack) -> Sides:
    import psycopg2

    from fencekit import psycopg2 as fk_psycopg2

    def connect(autocommit: bool = False) -> Any:
        conn = psycopg2.connect(dsn)
        stack.callback(conn.close)
        conn.autocommit = autocommit
        return conn

    u, co, installed = connect(), connect(), connect()  # a side each (see _measure)
    lc, fl = connect(autocommit=True), connect(autocommit=True)
    plain, fenced = _sql("plain", "%s"), _sql("fenced", "%s")
    cond = _cond("%s", "%s")
    u_cur, lc_cur, fl_cur, co_cur = u.cursor(), lc.cursor(), fl.cursor(), co.cursor()

    def unfenced(row: int, token: int) -> None:
        u_cur.execute(plain, (row,))
        u.commit()

    def least(row: int, token: int) -> None:
        lc_cur.execute(_least(token))
        lc_cur.execute(fenced, (row,))
        lc_cur.execute(b"COMMIT")

    def floor(row: int, token: int) -> None:
        with fencing(token):
            fl_cur.execute(_floor())
            fl_cur.execute(fenced, (row,))
            fl_cur.execute(b"COMMIT")

    def conditional(row: int, token: int) -> None:
        co_cur.execute(cond, (token, row, token))
        co.commit()

    fk_psycopg2.install(installed)  # as a pool installed with the adapter hands it out
    installed_cur = installed.cursor()

    def adapter(row: int, token: int) -> None:
        with fencing(token):
            installed_cur.execute(fenced, (row,))
            installed.commit()

    return {
        "unfenced": Side(unfenced, u.info.backend_pid),
        "least": Side(least, lc.info.backend_pid),
        "floor": Side(floor, fl.info.backend_pid),
        "conditional": Side(conditional, co.info.backend_pid),
        "adapter": Side(adapter, installed.info.backend_pid),
    }


def _asyncpg(dsn: str, stack: ExitStack) -> Sides:
    import asyncio

    import asyncpg

    from fencekit import asyncpg as fk_asyncpg

    params = psycopg.conninfo.conninfo_to_dict(dsn)
    kwargs = {
        "host": params.get("host"),
        "port": int(str(params["port"])) if params.get("port") else None,
        "user": params.get("user"),
        "password": params.get("password"),
        "database": params.get("dbname"),
        "ssl": False if params.get("sslmode") == "disable" else None,
        "server_settings": {"lock_timeout": _LOCK_TIMEOUT},
    }
    kwargs = {k: v for k, v in kwargs.items() if v is not None}

    class Minimal(asyncpg.Connection):  # type: ignore[misc]  # asyncpg ships no types
        """The floor on asyncpg: its one hook is the connection's class, so a wrapper pays a
        Python ``execute()`` before asyncpg's on every statement. This one only puts the
        scope's token into a BEGIN: no state, no error handling, nothing else fenced."""

        __slots__ = ()

        def execute(self, query: str, *args: Any, timeout: float | None = None) -> Any:
            if query == "BEGIN" and not args:
                query = _floor().decode()
            return super().execute(query, *args, timeout=timeout)

    loop = asyncio.new_event_loop()
    stack.callback(loop.close)
    run = loop.run_until_complete
    u, lc, co, installed = (run(asyncpg.connect(**kwargs)) for _ in range(4))  # see _measure
    fl = run(asyncpg.connect(**kwargs, connection_class=Minimal))
    for c in (u, lc, fl, co, installed):
        stack.callback(run, c.close())
    fk_asyncpg.install(installed)  # as a pool's init=fencekit.asyncpg.init does
    plain, fenced = _sql("plain", "$1"), _sql("fenced", "$1")
    cond = _cond("$2", "$1")

    # Every side opens and ends its transaction with execute("BEGIN"/"COMMIT"), the only way
    # the least cost can be written; conn.transaction() sends the same statements through the
    # same fenced path, plus asyncpg's own Transaction object (the same cost on every side).
    async def unfenced(row: int) -> None:
        await u.execute("BEGIN")
        await u.execute(plain, row)
        await u.execute("COMMIT")

    async def least(row: int, token: int) -> None:
        await lc.execute(_least(token).decode())
        await lc.execute(fenced, row)
        await lc.execute("COMMIT")

    async def floor(row: int, token: int) -> None:
        with fencing(token):
            await fl.execute("BEGIN")
            await fl.execute(fenced, row)
            await fl.execute("COMMIT")

    async def conditional(row: int, token: int) -> None:
        await co.execute("BEGIN")
        await co.execute(cond, token, row)
        await co.execute("COMMIT")

    async def adapter(row: int, token: int) -> None:
        with fencing(token):
            await installed.execute("BEGIN")
            await installed.execute(fenced, row)
            await installed.execute("COMMIT")

    return {
        "unfenced": Side(lambda row, token: run(unfenced(row)), u.get_server_pid()),
        "least": Side(lambda row, token: run(least(row, token)), lc.get_server_pid()),
        "floor": Side(lambda row, token: run(floor(row, token)), fl.get_server_pid()),
        "conditional": Side(lambda row, token: run(conditional(row, token)), co.get_server_pid()),
        "adapter": Side(lambda row, token: run(adapter(row, token)), installed.get_server_pid()),
    }


def _sqlalchemy(dsn: str, stack: ExitStack) -> Sides:
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import URL

    from fencekit import sqlalchemy as fk_sqlalchemy

    params = psycopg.conninfo.conninfo_to_dict(dsn)
    host = str(params.get("host") or "localhost")
    query = {"host": host} if host.startswith("/") else {}
    for name in ("sslmode", "options"):
        if params.get(name):
            query[name] = str(params[name])
    url = URL.create(
        "postgresql+psycopg",
        username=str(params["user"]) if params.get("user") else None,
        password=str(params["password"]) if params.get("password") else None,
        host=None if host.startswith("/") else host,
        port=int(str(params["port"])) if params.get("port") else None,
        database=str(params.get("dbname") or "postgres"),
        query=query,
    )
    engines = [create_engine(url, pool_size=1, max_overflow=0) for _ in range(5)]
    for e in engines:
        stack.callback(e.dispose)
    engine, cond_engine, least_engine, floor_engine, fenced_engine = engines  # see _measure
    least_engine = least_engine.execution_options(isolation_level="AUTOCOMMIT")
    floor_engine = floor_engine.execution_options(isolation_level="AUTOCOMMIT")
    fk_sqlalchemy.install(fenced_engine)
    plain, fenced = text(_sql("plain", ":row")), text(_sql("fenced", ":row"))
    cond = text(_cond(":row", ":token"))

    def unfenced(row: int, token: int) -> None:
        with engine.begin() as c:
            c.execute(plain, {"row": row})

    def least(row: int, token: int) -> None:
        with least_engine.connect() as c:
            c.exec_driver_sql(_least(token).decode())
            c.execute(fenced, {"row": row})
            c.exec_driver_sql("COMMIT")

    def floor(row: int, token: int) -> None:
        with fencing(token), floor_engine.connect() as c:
            c.exec_driver_sql(_floor().decode())
            c.execute(fenced, {"row": row})
            c.exec_driver_sql("COMMIT")

    def conditional(row: int, token: int) -> None:
        with cond_engine.begin() as c:
            c.execute(cond, {"row": row, "token": token})

    def adapter(row: int, token: int) -> None:
        with fencing(token), fenced_engine.begin() as c:
            c.execute(fenced, {"row": row})

    def pid(e: Any) -> int:
        with e.connect() as c:
            return int(c.exec_driver_sql("SELECT pg_backend_pid()").scalar())

    return {
        "unfenced": Side(unfenced, pid(engine)),
        "least": Side(least, pid(least_engine)),
        "floor": Side(floor, pid(floor_engine)),
        "conditional": Side(conditional, pid(cond_engine)),
        "adapter": Side(adapter, pid(fenced_engine)),
    }


_CASES: list[tuple[str, str | None, Builder]] = [
    ("psycopg transaction()", None, lambda d, s: _psycopg(d, s, automatic=False)),
    ("psycopg install() + fencing()", None, lambda d, s: _psycopg(d, s, automatic=True)),
    ("psycopg2 install() + fencing()", "psycopg2", _psycopg2),
    ("asyncpg install() + fencing()", "asyncpg", _asyncpg),
    ("SQLAlchemy on psycopg (Core, engine.begin())", "sqlalchemy", _sqlalchemy),
]

_VERSUS = {
    "unfenced": ("vs the same driver unfenced", ""),
    "least": ("vs the least cost (one SET LOCAL in the BEGIN)", ">= 0.95x"),
    "floor": ("vs the floor (the least cost in its fencing() scope)", ""),
    "conditional": ("vs a hand-written conditional UPDATE", ""),
}


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.0f}"


def _rows(
    label: str, times: dict[str, dict[str, float]], trips: dict[str, float]
) -> list[dict[str, Any]]:
    mine = times["adapter"]
    cpu = mine["client"] + mine["server"]
    out = []
    for other, (versus, target) in _VERSUS.items():
        theirs = times[other]
        their_cpu = theirs["client"] + theirs["server"]
        detail = (
            f"wall {theirs['wall'] / mine['wall']:.2f}x; CPU/tx client+server "
            f"{_us(mine['client'])}+{_us(mine['server'])} vs "
            f"{_us(theirs['client'])}+{_us(theirs['server'])} us; round trips/tx "
            f"{trips.get('adapter', 0):g} vs {trips.get(other, 0):g}"
        )
        if other == "least" and "floor" in times:  # the best ratio any adapter can reach here
            floor = times["floor"]["client"] + times["floor"]["server"]
            detail += f"; the floor reaches {their_cpu / floor:.2f}x"
        out.append({
            "name": f"{label} {versus} ({detail})",
            "baseline": their_cpu,
            "fenced": cpu,
            "ratio": their_cpu / cpu if cpu else 0.0,
            "unit": "s CPU/tx",
            "target": target,
            "wall_ratio": theirs["wall"] / mine["wall"],
            "client": {"adapter": mine["client"], other: theirs["client"]},
            "server": {"adapter": mine["server"], other: theirs["server"]},
            "round_trips": {"adapter": trips.get("adapter"), other: trips.get(other)},
        })  # fmt: skip
    return out


def run(
    dsn: str, *, quick: bool = False, progress: Callable[[str], None] = lambda _: None
) -> list[dict[str, Any]]:
    """Run the adapter benchmarks against ``dsn`` (a database with fencekit's core installed).

    Creates and drops schema ``fencekit_bench_adapters``. psycopg2, asyncpg and SQLAlchemy
    cases are left out when their package is not installed.
    """
    transactions = 300 if quick else 2000
    rounds = 3 if quick else 9
    results: list[dict[str, Any]] = []
    # A side that waits on a lock fails loudly instead of hanging the run.
    dsn = psycopg.conninfo.make_conninfo(dsn, options=f"-c lock_timeout={_LOCK_TIMEOUT}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        _setup(conn)
        counter = _TripCounter(dsn)
        try:
            for label, module, build in _CASES:
                if module is not None:
                    try:
                        __import__(module)
                    except ImportError:
                        progress(f"adapters: {module} not installed, {label} skipped")
                        continue
                progress(f"adapters: {label}")
                try:
                    trips = _trips(build, counter)
                except (OSError, psycopg.Error) as exc:  # the proxy could not reach the server
                    progress(f"adapters: round trips not counted ({exc})")
                    trips = {}
                with ExitStack() as stack:
                    times = _measure(build(dsn, stack), transactions, rounds)
                results.extend(_rows(label, times, trips))
        finally:
            counter.close()
            _teardown(conn)
    return results
