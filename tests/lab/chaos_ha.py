"""``python -m tests.lab ha``: workers contend for leases while a Patroni primary dies.

A real two-node cluster (:mod:`tests.lab.patroni`: PostgreSQL under Patroni, etcd) runs the
chaos register, fenced lease-bound, with fencekit's built-in issuer in the same database.
Worker threads take leases (``fencekit.acquire``) and do read-modify-writes under their tokens
through the multi-host DSN (``target_session_attrs=read-write``); mid-run the nemesis kills the
primary (Patroni and PostgreSQL, SIGKILL) and Patroni promotes the standby. The workers carry on
against the new primary. Once with asynchronous, once with synchronous replication.

The history goes to the chaos checker (:func:`fencekit.chaos.checker.check`) with one declared
step first, the failover's loss: what the promoted standby never received is read from the new
primary (its ``chaos_log`` and its grant history), and

- an acknowledged write it lacks is **lost in the failover**: reported, counted, and given to
  the checker as an unknown outcome (its client heard "ok", the cluster forgot it: the async
  contract, bounded by the replication lag; under sync replication any such loss fails the run);
- a grant it lacks **ended at the failover** (a ``release`` event at the kill), since from then
  on no server knows it: the zombie that holds it is refused by the lease-bound fence.

Everything else is checked as in any chaos run: tokens unique and rising (across the epoch
change), no stale or unfenced write accepted, no write accepted after a newer grant, no lost
update, durability of every other acknowledged write.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from fencekit.chaos.checker import LogRow, Report, check, format_report
from fencekit.chaos.history import Event, true_time
from fencekit.chaos.run import final_state
from fencekit.errors import CommitOutcomeUnknownError, FenceError, IssuerError
from fencekit.leases.base import Grant
from fencekit.leases.postgres import PostgresIssuer
from fencekit.psycopg import transaction
from tests.lab.patroni import PatroniCluster

__all__ = ["HAConfig", "HAResult", "format_ha", "run_ha"]

LEASE_PREFIX = "chaos"

_SCHEMA = """
CREATE TABLE chaos_register (
  resource text PRIMARY KEY,
  value    bigint NOT NULL DEFAULT 0,
  seq      bigint NOT NULL DEFAULT 0
);
CREATE TABLE chaos_log (
  resource text NOT NULL,
  seq      bigint NOT NULL,
  token    bigint,
  value    bigint NOT NULL,
  observed bigint NOT NULL,
  write_id text PRIMARY KEY
);
-- Every grant, in the transaction that made it (so exactly as durable): after the failover it
-- tells which grants the new primary knows.
CREATE TABLE chaos_grants (resource text NOT NULL, token bigint NOT NULL, holder text);
CREATE FUNCTION chaos_grants_log() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF TG_OP = 'INSERT' OR NEW.token <> OLD.token THEN
    INSERT INTO public.chaos_grants VALUES (NEW.resource, NEW.token, NEW.holder);
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER chaos_grants AFTER INSERT OR UPDATE ON fencekit.leases
  FOR EACH ROW EXECUTE FUNCTION chaos_grants_log();
"""
_READ = "SELECT value FROM chaos_register WHERE resource = %s"
_UPDATE = "UPDATE chaos_register SET value = %s, seq = seq + 1 WHERE resource = %s RETURNING seq"
_LOG = (
    "INSERT INTO chaos_log (resource, seq, token, value, observed, write_id) "
    "VALUES (%s, %s, %s, %s, %s, %s)"
)


@dataclass
class HAConfig:
    mode: str = "async"  # or "sync"
    duration: float = 12.0
    kill_at: float = 0.4  # fraction of the run
    workers: int = 4
    resources: int = 3
    ttl: float = 2.0
    #: seconds the standby receives nothing before the kill (its WAL sender stopped): the lag an
    #: asynchronous failover loses, and the wait a synchronous commit is cut off in
    lag: float = 1.0
    seed: int | None = None
    history: Path | None = None  # where to save the merged history (JSON lines)

    def __post_init__(self) -> None:
        if self.mode not in ("async", "sync"):
            raise ValueError(f"mode must be async or sync, not {self.mode!r}")
        if self.duration <= 2 or not 0 < self.kill_at < 1:
            raise ValueError("duration must exceed 2 s and kill_at lie between 0 and 1")


@dataclass
class HAResult:
    config: HAConfig
    report: Report
    events: list[str]  # the cluster's event lines (start, kill, promotion)
    failover_s: float = 0.0
    timelines: tuple[int, int] = (0, 0)
    lost_writes: list[str] = field(default_factory=list)  # acked, absent on the new primary
    lost_grants: list[str] = field(default_factory=list)  # granted, unknown to the new primary
    lost_window_ms: float = 0.0  # how long before the kill the oldest lost ack was
    writes_after: int = 0  # acknowledged writes after the failover
    zombie_refusals: int = 0  # writes under a lost grant's token, refused

    @property
    def ok(self) -> bool:
        if self.report.violations:
            return False
        if self.config.mode == "sync" and (self.lost_writes or self.lost_grants):
            return False  # synchronous replication loses nothing acknowledged
        return self.writes_after > 0  # the run must have gone on after the failover

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.config.mode,
            "ok": self.ok,
            "failover_s": round(self.failover_s, 3),
            "timelines": list(self.timelines),
            "lost_writes": len(self.lost_writes),
            "lost_grants": len(self.lost_grants),
            "lost_window_ms": round(self.lost_window_ms, 1),
            "writes_after_failover": self.writes_after,
            "zombie_refusals": self.zombie_refusals,
            "cluster": self.events,
            "report": self.report.as_dict(),
        }


class _History:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self._lock = threading.Lock()
        self._n: dict[str, int] = {}

    def append(self, p: str, type_: str, **data: Any) -> Event:
        with self._lock:
            self._n[p] = self._n.get(p, 0) + 1
            event: Event = {"t": true_time(), "p": p, "n": self._n[p], "type": type_, **data}
            self.events.append(event)
            return event


class _Worker(threading.Thread):
    def __init__(self, name: str, dsn: str, cfg: HAConfig, h: _History, until: float) -> None:
        super().__init__(name=name, daemon=True)
        self.p, self.dsn, self.cfg, self.h, self.until = name, dsn, cfg, h, until
        self.rng = random.Random(f"{cfg.seed}:{name}")
        self.resources = [f"r{i}" for i in range(cfg.resources)]
        self.writes = 0
        self.conn: psycopg.Connection[Any] | None = None

    def connection(self) -> psycopg.Connection[Any] | None:
        if self.conn is None or self.conn.closed or self.conn.broken:
            try:
                self.conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=2)
            except psycopg.Error:
                time.sleep(0.1)
                return None
        return self.conn

    def run(self) -> None:
        with PostgresIssuer(self.dsn, timeout=2) as issuer:
            while time.monotonic() < self.until:
                resource = self.rng.choice(self.resources)
                holder = f"{self.p}#{uuid.uuid4().hex[:8]}"
                t0 = true_time()
                try:
                    grant = issuer.try_acquire(f"{LEASE_PREFIX}:{resource}", holder, self.cfg.ttl)
                except (IssuerError, psycopg.Error):
                    time.sleep(0.1)
                    continue
                if grant is None:
                    time.sleep(self.rng.uniform(0.005, 0.03))
                    continue
                self.h.append(
                    self.p, "acquire", resource=resource, token=grant.token, holder=holder,
                    t0=t0, ttl=grant.ttl, issuer=grant.issuer,
                )  # fmt: skip
                self.hold(issuer, resource, grant)
        if self.conn is not None:
            self.conn.close()

    def hold(self, issuer: PostgresIssuer, resource: str, grant: Grant) -> None:
        for _ in range(self.rng.randint(1, 4)):
            if time.monotonic() >= self.until:
                return
            result = self.write(resource, grant.token)
            # A worker cut off by the failover carries on under the token it holds, as a
            # zombie would: through the multi-host DSN its retry reaches the new primary.
            for _retry in range(30):
                if result not in ("down", "error") or time.monotonic() >= self.until:
                    break
                time.sleep(0.1)
                result = self.write(resource, grant.token)
            if result != "ok":
                return
            t0 = true_time()
            try:
                if not issuer.renew(grant):
                    self.h.append(self.p, "lost", resource=resource, holder=grant.holder, t0=t0)
                    return
            except (IssuerError, psycopg.Error):
                return
            self.h.append(self.p, "renew", resource=resource, holder=grant.holder, t0=t0)
        t0 = true_time()
        self.h.append(self.p, "release", resource=resource, holder=grant.holder, t0=t0)
        with contextlib.suppress(IssuerError, psycopg.Error):
            issuer.release(grant)

    def write(self, resource: str, token: int) -> str:
        conn = self.connection()
        if conn is None:
            return "down"
        try:
            row = conn.execute(_READ, (resource,)).fetchone()
        except psycopg.Error:
            return "down"
        assert row is not None
        observed = int(row[0])
        time.sleep(self.rng.uniform(0.002, 0.02))
        self.writes += 1
        wid = f"{self.p}-{self.writes}"
        self.h.append(
            self.p, "invoke", id=wid, resource=resource, token=token, observed=observed,
            value=observed + 1,
        )  # fmt: skip
        try:
            with transaction(conn, token):
                got = conn.execute(_UPDATE, (observed + 1, resource)).fetchone()
                assert got is not None
                seq = int(got[0])
                conn.execute(_LOG, (resource, seq, token, observed + 1, observed, wid))
        except FenceError as exc:
            self.h.append(
                self.p, "fail", id=wid, reason=exc.reason, sqlstate=exc.sqlstate, fence=exc.fence
            )
            return "rejected"
        except CommitOutcomeUnknownError as exc:
            self.h.append(self.p, "info", id=wid, error=str(exc).splitlines()[0])
            return "error"
        except psycopg.Error as exc:
            # Lost before COMMIT was sent: the server rolls the transaction back.
            self.h.append(self.p, "fail", id=wid, reason="connection", error=str(exc)[:200])
            return "error"
        self.h.append(self.p, "ok", id=wid, seq=seq)
        return "ok"


def _setup(dsn: str, resources: int) -> None:
    from fencekit.spec import FenceSpec, Scope, TableName
    from fencekit.sqlgen import protect_statements, render_install

    with psycopg.connect(dsn) as conn:
        conn.execute(render_install().encode())
        conn.execute(_SCHEMA.encode())
        for i in range(resources):
            conn.execute("INSERT INTO chaos_register (resource) VALUES (%s)", (f"r{i}",))
        spec = FenceSpec(
            TableName("public", "chaos_register"),
            scope=Scope.KEY,
            key=("resource",),
            resource=LEASE_PREFIX,
            lease_bound=True,
        )
        for stmt in protect_statements(spec):
            conn.execute(stmt.encode())


def _final(dsn: str) -> tuple[list[LogRow], dict[str, tuple[int, int]], set[tuple[str, int]]]:
    """The run's final state (run.final_state) and the grants the new primary knows."""
    log, register = final_state(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        grants = {
            (str(r).removeprefix(f"{LEASE_PREFIX}:"), int(t))
            for r, t in conn.execute("SELECT resource, token FROM chaos_grants")
        }
    return log, register, grants


def _declare_loss(
    events: list[Event], log: list[LogRow], known: set[tuple[str, int]], t_kill: float
) -> tuple[list[Event], list[str], list[str], float, int]:
    """The failover's loss, declared before the checker runs (see the module docstring)."""
    logged = {row.write_id for row in log}
    invokes = {str(e["id"]): e for e in events if e["type"] == "invoke"}
    lost_writes: list[str] = []
    oldest = t_kill
    out: list[Event] = []
    for e in events:
        # Judged by when the write was sent, not when its acknowledgement was recorded: the
        # old primary can acknowledge a commit just before it dies while the client records
        # the "ok" after the kill (a write sent after the kill went to the new primary).
        if (
            e["type"] == "ok"
            and str(e["id"]) not in logged
            and float(invokes[str(e["id"])]["t"]) <= t_kill
        ):
            lost_writes.append(str(e["id"]))
            oldest = min(oldest, float(invokes[str(e["id"])]["t"]))
            out.append({**e, "type": "info", "error": "acknowledged, lost in the failover"})
        else:
            out.append(e)
    lost_grants: list[str] = []
    lost_tokens: set[int] = set()
    for e in events:
        if e["type"] == "acquire" and (str(e["resource"]), int(e["token"])) not in known:
            lost_grants.append(f"{e['resource']}:{e['token']}")
            lost_tokens.add(int(e["token"]))
            out.append(
                {"t": t_kill, "p": "failover", "n": len(lost_grants), "type": "release",
                 "resource": e["resource"], "holder": e["holder"], "t0": t_kill}
            )  # fmt: skip
    refused = sum(
        1
        for e in out
        if e["type"] == "fail"
        and e.get("reason") in ("lease_mismatch", "stale")
        and int(invokes[str(e["id"])].get("token") or 0) in lost_tokens
    )
    return out, lost_writes, lost_grants, (t_kill - oldest) * 1000, refused


def run_ha(
    cfg: HAConfig,
    *,
    cluster: PatroniCluster | None = None,
    say: Callable[[str], None] = lambda _s: None,
) -> HAResult:
    """One HA chaos run (starts and stops its own cluster unless one is given)."""
    own = cluster is None
    if cluster is None:
        say("starting a Patroni cluster (2 x PostgreSQL 15, etcd) on loopback")
        cluster = PatroniCluster.start_new()
    try:
        for node in cluster.nodes:
            if not node.running:
                cluster.rejoin(node)
        cluster.set_synchronous(cfg.mode == "sync")
        db = f"chaos_ha_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(cluster.dsn, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {db}")
        dsn = cluster.dsn_for(db)
        _setup(dsn, cfg.resources)
        cluster.wait_caught_up()
        before = cluster.timeline()
        h = _History()
        h.append("run", "run", scope="lease-bound", issuer="postgres", fence=True, ha=cfg.mode)
        start = time.monotonic()
        until = start + cfg.duration
        workers = [_Worker(f"w{i}", dsn, cfg, h, until) for i in range(cfg.workers)]
        say(f"{cfg.workers} workers, {cfg.resources} resources, {cfg.mode} replication, "
            f"{cfg.duration:g}s; standby cut off {cfg.lag:g}s before the primary is killed at "
            f"{cfg.kill_at * cfg.duration:.1f}s")  # fmt: skip
        for w in workers:
            w.start()
        first_event = len(cluster.events)
        time.sleep(max(0.0, cfg.kill_at * cfg.duration - cfg.lag))
        with cluster.replication_paused():
            h.append("nemesis", "node", fault=True, what=f"replication stopped for {cfg.lag}s")
            time.sleep(cfg.lag)
            t0 = time.monotonic()
            new = cluster.standby()
            sent = true_time()
            cluster.kill_primary()  # returns once every process of the old primary is gone
            t_kill = true_time()  # nothing is acknowledged by the old primary after this
            # A kill is an interval (signal sent -> processes gone), not an instant: the event
            # carries both ends, and the loss window below runs to its end.
            h.append("nemesis", "node", fault=True, what="kill primary", t0=sent)
            cluster.wait_primary(new)
            took = time.monotonic() - t0
            cluster.note(f"{new.name} promoted, writable after {took:.2f}s")
        h.append("nemesis", "node", fault=False, what=f"standby promoted in {took:.2f}s")
        say(f"primary killed; standby promoted and writable after {took:.2f}s")
        for w in workers:
            w.join(cfg.duration + 30)
        after = cluster.timeline()
        log, register, known = _final(dsn)
        events, lost_w, lost_g, window, refused = _declare_loss(h.events, log, known, t_kill)
        if cfg.history is not None:
            with open(cfg.history, "w", encoding="utf-8") as fh:
                for e in sorted(events, key=lambda e: (e["t"], e["p"], e["n"])):
                    fh.write(json.dumps(e, separators=(",", ":"), default=str) + "\n")
        report = check(events, log, register, scope="lease-bound", issuer="postgres")
        writes_after = sum(1 for e in events if e["type"] == "ok" and float(e["t"]) > t_kill)
        return HAResult(
            cfg, report, list(cluster.events[first_event:]), took, (before, after), lost_w, lost_g,
            window if lost_w else 0.0, writes_after, refused,
        )  # fmt: skip
    finally:
        if own:
            cluster.stop()


def format_ha(res: HAResult) -> str:
    c = res.config
    lines = [
        f"python -m tests.lab ha ({c.mode} replication): {'PASS' if res.ok else 'FAIL'}",
        f"  failover: primary killed, standby writable after {res.failover_s:.2f}s; "
        f"timeline {res.timelines[0]} -> {res.timelines[1]}",
        f"  lost in the failover: {len(res.lost_writes)} acknowledged write(s)"
        + (f" (acknowledged within {res.lost_window_ms:.0f} ms before the kill)"
           if res.lost_writes else "")
        + f", {len(res.lost_grants)} grant(s)",
        f"  zombie writes under a lost grant's token refused: {res.zombie_refusals}",
        f"  acknowledged writes after the failover: {res.writes_after}",
    ]  # fmt: skip
    if c.mode == "sync" and (res.lost_writes or res.lost_grants):
        lines.append("  FAIL: synchronous replication lost acknowledged work")
    if res.writes_after == 0:
        lines.append("  FAIL: no write was acknowledged after the failover")
    lines += ["  cluster:", *(f"    {e}" for e in res.events)]
    lines.append(format_report(res.report))
    return "\n".join(lines)


def cli_run(args: Any) -> int:
    """``python -m tests.lab ha [async|sync|both]``: the runs, their reports, the exit status."""
    from tests.lab.patroni import ClusterError

    modes = ("async", "sync") if args.ha == "both" else (args.ha,)
    try:
        configs = [
            HAConfig(
                mode=mode,
                duration=args.duration,
                workers=args.workers,
                resources=args.resources,
                ttl=args.ttl,
                seed=args.seed,
                history=None
                if args.history is None
                else Path(f"{args.history}.{mode}" if len(modes) > 1 else args.history),
            )
            for mode in modes
        ]
    except ValueError as exc:
        print(f"python -m tests.lab ha: {exc}")
        return 2
    results: list[HAResult] = []
    try:
        with PatroniCluster.start_new() as cluster:
            print(f"python -m tests.lab ha: Patroni cluster up ({cluster.nodes[0].name}, "
                  f"{cluster.nodes[1].name}, etcd) on loopback")  # fmt: skip
            for cfg in configs:
                res = run_ha(cfg, cluster=cluster, say=lambda s: print(f"  {s}"))
                print(format_ha(res))
                results.append(res)
    except ClusterError as exc:
        print(f"python -m tests.lab ha: error: {exc}")
        return 1
    if args.json:
        print(
            json.dumps({"ok": all(r.ok for r in results), "runs": [r.as_dict() for r in results]})
        )
    return 0 if all(r.ok for r in results) else 1
