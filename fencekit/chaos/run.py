"""One chaos run: server, schema, workers, nemesis, then the checker over the history.

Where it runs is an :class:`Environment`: by default your database (``dsn``) or the embedded
server, with pauses and kills of the workers as the faults. The lab (tests/lab/chaos.py, in a
checkout) brings its own: a server it crashes and restarts, pgbouncer, faked clocks, etcd and
ZooKeeper clusters whose nodes it kills.
"""

from __future__ import annotations

import contextlib
import math
import random
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from fencekit.chaos.checker import (
    GAP,
    GAP_CLOSES,
    SCOPES,
    LogRow,
    Report,
    check,
    final_state_events,
    format_report,
)
from fencekit.chaos.history import HistoryWriter, merge, write_merged
from fencekit.chaos.nemesis import Fault, Nemesis
from fencekit.chaos.worker import LEASE_PREFIX
from fencekit.errors import ChaosSetupError, FencekitError

__all__ = [
    "ISSUERS",
    "SCOPES",
    "ChaosConfig",
    "ChaosResult",
    "Environment",
    "Target",
    "WorkerRole",
    "run_chaos",
]

ISSUERS = ("postgres", "etcd", "zookeeper")

_SCHEMA = """
CREATE TABLE chaos_register (
  resource text PRIMARY KEY,
  value    bigint NOT NULL DEFAULT 0,
  seq      bigint NOT NULL DEFAULT 0   -- committed writes so far: the commit order
);
CREATE TABLE chaos_log (
  resource text NOT NULL,
  seq      bigint NOT NULL,
  token    bigint,
  value    bigint NOT NULL,
  observed bigint NOT NULL,
  write_id text NOT NULL UNIQUE,
  PRIMARY KEY (resource, seq)
);
"""


@dataclass
class ChaosConfig:
    duration: float = 20.0
    seed: int = 0
    workers: int = 4
    resources: int = 3
    fence: bool = True
    scope: str = "key"  # key fence (named resource), row fence, or lease-bound key fence
    dsn: str | None = None
    history: Path | None = None
    ttl: float = 0.5
    #: where leases come from: fencekit's PostgreSQL issuer, or an etcd cluster / ZooKeeper
    #: ensemble at ``endpoints`` (``host:port,...``)
    issuer: str = "postgres"
    endpoints: str = ""
    #: write a self-contained HTML timeline of the run here
    report: Path | None = None
    #: tests only: ``module:function(worker_args) -> Issuer`` replaces the issuer in workers
    issuer_factory: str | None = None
    #: a write whose COMMIT gets no answer for this long is abandoned as indeterminate
    commit_timeout: float = 1.0

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise ValueError(f"scope must be one of {', '.join(SCOPES)}, not {self.scope!r}")
        if self.issuer not in ISSUERS:
            raise ValueError(f"issuer must be one of {', '.join(ISSUERS)}, not {self.issuer!r}")
        if self.scope == "lease-bound" and self.issuer != "postgres":
            raise ValueError(
                "--scope lease-bound checks the live lease in fencekit.leases: it needs "
                "the postgres issuer (etcd and ZooKeeper leases are not in the database)"
            )
        if not (1 <= self.workers <= 32 and 1 <= self.resources <= 1000):
            raise ValueError("workers must be 1..32 and resources 1..1000")
        if not (1 <= self.duration <= 24 * 3600):
            raise ValueError("duration must be 1 s to 24 h")
        if not (0.1 <= self.ttl <= 30):
            raise ValueError("ttl must be 0.1 to 30 s")


@dataclass
class ChaosResult:
    config: ChaosConfig
    report: Report
    server: str
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    #: the application role the workers connected as (created for the run, dropped after it)
    worker_role: str = ""

    @property
    def ok(self) -> bool:
        """The outcome expected for the mode: no violation fenced, some without fencing."""
        bad = len(self.report.violations)
        return bad == 0 if self.config.fence and not self.config.issuer_factory else bad > 0


@dataclass
class Target:
    """The server a run uses: ``admin_dsn`` sets up, watches and checks."""

    admin_dsn: str
    host: str
    port: int
    user: str
    kind: str


@dataclass(frozen=True)
class WorkerRole:
    name: str
    password: str


class Environment:
    """Where a run happens and what may go wrong there besides pauses and kills.

    This one is fencekit's own: your server (``ChaosConfig.dsn``: a database and a role are
    created and dropped there) or else the embedded server; no crash, no other fault. The lab
    subclasses it with servers it starts and faults it injects into them.
    """

    #: issuer endpoints this environment provides (used when ``ChaosConfig.endpoints`` is empty)
    endpoints = ""

    def __init__(self) -> None:
        self.notes: list[str] = []
        #: added to the worker processes' environment (e.g. a faked clock)
        self.worker_env: dict[str, str] = {}

    def target(
        self, cfg: ChaosConfig, stack: contextlib.ExitStack, say: Callable[[str], None]
    ) -> Target:
        if cfg.dsn:
            p = conninfo_to_dict(cfg.dsn)
            return Target(
                cfg.dsn,
                str(p.get("host") or "localhost"),
                int(p.get("port") or 5432),
                str(p.get("user") or "postgres"),
                "your server (--dsn)",
            )
        from fencekit.embedded import start_embedded

        say("starting the embedded PostgreSQL...")
        emb = start_embedded()
        stack.callback(emb.stop)
        return Target(emb.dsn, emb.host, emb.port, emb.user, "embedded")

    def worker_dsn(
        self, stack: contextlib.ExitStack, target: Target, dsn: str, role: WorkerRole
    ) -> str:
        """How the workers reach the run's database (directly, here)."""
        return make_conninfo(dsn, user=role.name, password=role.password)

    def faults(self) -> list[Fault]:
        return []

    def describe(self) -> dict[str, object]:
        """Extra fields of the history's ``run`` event."""
        return {}

    def summary(self) -> str:
        """What the header adds after the issuer (e.g. ", faults also on clocks")."""
        return ""

    def after_run(self) -> None:
        """Before the final state is read (e.g. start a server a crash left down)."""


@contextlib.contextmanager
def _database(admin_dsn: str) -> Iterator[str]:
    name = f"fencekit_chaos_{secrets.token_hex(4)}"
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_conninfo(admin_dsn, dbname=name)
    finally:
        with (
            contextlib.suppress(psycopg.Error),
            psycopg.connect(admin_dsn, autocommit=True, connect_timeout=5) as admin,
        ):
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@contextlib.contextmanager
def _worker_role(admin_dsn: str) -> Iterator[WorkerRole]:
    """A throwaway LOGIN role for the workers, as an application would connect: not a
    superuser, no CREATEDB/CREATEROLE; :func:`_setup` grants it DML on the chaos tables and
    fencekit_writer (to take leases) and nothing else. Dropped at the end of the run (after
    the database, which holds its privileges)."""
    role = WorkerRole(f"fencekit_chaos_worker_{secrets.token_hex(4)}", secrets.token_hex(16))
    try:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL(
                    "CREATE ROLE {} LOGIN PASSWORD {} NOSUPERUSER NOCREATEDB NOCREATEROLE "
                    "NOREPLICATION NOBYPASSRLS"
                ).format(sql.Identifier(role.name), sql.Literal(role.password))
            )
    except psycopg.errors.InsufficientPrivilege as exc:
        raise ChaosSetupError(
            "the workers connect as an application role that the run creates and drops; "
            f"the role of --dsn may not create roles ({exc.diag.message_primary}): use a role "
            "with CREATEROLE and CREATEDB"
        ) from exc
    try:
        yield role
    finally:
        with (
            contextlib.suppress(psycopg.Error),
            psycopg.connect(admin_dsn, autocommit=True, connect_timeout=5) as admin,
        ):
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role.name)))


def _setup(dsn: str, cfg: ChaosConfig, resources: list[str], worker_role: str) -> None:
    from fencekit.spec import FenceSpec, Scope, TableName
    from fencekit.sqlgen import protect_statements, render_install

    with psycopg.connect(dsn) as conn:
        conn.execute(render_install().encode())
        conn.execute(_SCHEMA.encode())
        # The workers' role: read and write the chaos tables, take leases; nothing else.
        role = sql.Identifier(worker_role)
        dbname = sql.Identifier(str(conninfo_to_dict(dsn)["dbname"]))
        for grant in (
            sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(dbname, role),
            sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(role),
            sql.SQL(
                "GRANT SELECT, INSERT, UPDATE, DELETE ON chaos_register, chaos_log TO {}"
            ).format(role),
            sql.SQL("GRANT fencekit_writer TO {}").format(role),
        ):
            conn.execute(grant)
        for r in resources:
            conn.execute("INSERT INTO chaos_register (resource) VALUES (%s)", (r,))
        if cfg.fence:
            table = TableName("public", "chaos_register")
            if cfg.scope == "row":
                spec = FenceSpec(table)
            else:
                spec = FenceSpec(
                    table,
                    scope=Scope.KEY,
                    key=("resource",),
                    resource=LEASE_PREFIX,
                    lease_bound=cfg.scope == "lease-bound",
                )
            for stmt in protect_statements(spec):
                conn.execute(stmt.encode())


def _wait_quiet(dsn: str, timeout: float) -> None:
    """Wait until no other session of the database is inside a transaction (killed workers'
    in-flight commits land or abort before the final state is read)."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND state IS DISTINCT FROM 'idle'"
            ).fetchone()
            if row == (0,):
                return
            time.sleep(0.1)


def _issuer_version(cfg: ChaosConfig, endpoints: str, say: Callable[[str], None]) -> str | None:
    """The etcd server's version: the lease contract the checker holds it to depends on it."""
    if cfg.issuer != "etcd":
        return None
    from fencekit.leases.etcd import EtcdIssuer

    issuer = EtcdIssuer(endpoints, retry_deadline=5.0)
    try:
        return issuer.server_version()
    except FencekitError as exc:
        say(f"chaos: etcd's version unknown ({exc}): the checker holds it to the fixed contract")
        return None
    finally:
        issuer.close()


def final_state(dsn: str) -> tuple[list[LogRow], dict[str, tuple[int, int]]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        log = [
            LogRow(r, int(s), None if t is None else int(t), int(v), int(o), str(w))
            for r, s, t, v, o, w in conn.execute(
                "SELECT resource, seq, token, value, observed, write_id FROM chaos_log"
            ).fetchall()
        ]
        register = {
            str(r): (int(v), int(s))
            for r, v, s in conn.execute("SELECT resource, value, seq FROM chaos_register")
        }
    return log, register


def run_chaos(
    cfg: ChaosConfig,
    *,
    out: TextIO | None = None,
    progress: Callable[[str], None] | None = None,
    environment: Environment | None = None,
) -> ChaosResult:
    """Run workers and the nemesis for ``cfg.duration`` seconds, then check the history."""
    out = out or sys.stdout
    env = environment or Environment()
    started = time.monotonic()

    def say(text: str) -> None:
        (progress or (lambda s: print(s, file=sys.stderr, flush=True)))(text)

    if cfg.issuer != "postgres" and not cfg.endpoints and type(env) is Environment:
        raise ChaosSetupError(
            f"--issuer {cfg.issuer} takes its leases from your {cfg.issuer} cluster: give its "
            "client endpoints with --endpoints host:port[,host:port...]"
        )
    resources = [f"r{i}" for i in range(cfg.resources)]
    with contextlib.ExitStack() as stack:
        target = env.target(cfg, stack, say)
        endpoints = cfg.endpoints or env.endpoints  # an environment may start the cluster
        if cfg.issuer != "postgres" and not endpoints:
            raise ChaosSetupError(f"no {cfg.issuer} endpoints: give --endpoints")
        role = stack.enter_context(_worker_role(target.admin_dsn))
        dsn = stack.enter_context(_database(target.admin_dsn))
        _setup(dsn, cfg, resources, role.name)
        # Workers connect as the application role; the nemesis and the checker as the admin.
        worker_dsn = env.worker_dsn(stack, target, dsn, role)
        workdir = Path(tempfile.mkdtemp(prefix="fencekit-chaos-"))
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        nemesis_log = HistoryWriter(workdir / "nemesis.jsonl", "nemesis")
        stack.callback(nemesis_log.close)
        until = time.time() + cfg.duration

        def command(name: str) -> list[str]:
            return [
                sys.executable, "-m", "fencekit.chaos.worker", "--name", name,
                "--dsn", worker_dsn, "--resources", ",".join(resources),
                "--ttl", str(lease_ttl), "--until", repr(until), "--seed", str(cfg.seed),
                "--history", str(workdir / f"{name}.jsonl"),
                "--issuer", cfg.issuer, "--endpoints", endpoints,
                "--issuer-factory", cfg.issuer_factory or "",
                "--commit-timeout", str(cfg.commit_timeout),
            ]  # fmt: skip

        nemesis_log.append(
            "run", scope=cfg.scope, issuer=cfg.issuer, fence=cfg.fence, seed=cfg.seed,
            workers=cfg.workers, resources=cfg.resources, ttl=cfg.ttl,
            issuer_factory=cfg.issuer_factory, issuer_version=_issuer_version(cfg, endpoints, say),
            **env.describe(),
        )  # fmt: skip

        # etcd grants whole seconds (at least 1 with the cluster's election timeout); a
        # ZooKeeper session of under 1 s expires in every election. Pauses must outlast them.
        lease_ttl = cfg.ttl
        if cfg.issuer == "etcd":
            lease_ttl = max(1.0, float(math.ceil(cfg.ttl)))
        elif cfg.issuer == "zookeeper":
            lease_ttl = max(1.0, cfg.ttl)
        nemesis = Nemesis(
            rng=random.Random(cfg.seed),
            ttl=lease_ttl,
            command=command,
            workdir=workdir,
            history=nemesis_log,
            admin_dsn=dsn,
            progress=say,
            faults=env.faults(),
            worker_env=env.worker_env,
        )
        stack.callback(nemesis.close)
        mode = "fenced" if cfg.fence else "NOT fenced"
        say(f"chaos: {cfg.workers} workers, {cfg.resources} resources, {mode}, {cfg.duration:g}s")
        nemesis.run([f"w{i}" for i in range(cfg.workers)], cfg.duration)
        nemesis.wait_workers(timeout=30)
        env.after_run()
        _wait_quiet(dsn, 15)
        log, register = final_state(dsn)
        events = merge(sorted(workdir.glob("*.jsonl"))) + final_state_events(log, register)
        if cfg.history is not None:
            write_merged(events, cfg.history)
        report = check(events)
        notes = list(env.notes)
        if cfg.report is not None:
            from fencekit.chaos.report import write_html

            try:
                write_html(events, report, cfg.report, title=_header_line(cfg, env))
            except (RuntimeError, OSError) as exc:  # the run's result stands without it
                notes.append(f"no HTML report: {exc}")
    result = ChaosResult(
        cfg, report, target.kind, time.monotonic() - started, notes, worker_role=role.name
    )
    print(_header(result, env), file=out)
    print(format_report(report), file=out)
    for note in notes:
        print(f"note: {note}", file=out)
    print(_verdict(result), file=out, flush=True)
    return result


def _header_line(c: ChaosConfig, env: Environment) -> str:
    fence = f"{c.scope} fence" if c.fence else "NO fence (--no-fence)"
    issuer = c.issuer + (f" wrapped by {c.issuer_factory}" if c.issuer_factory else "")
    extra = env.summary()
    return (
        f"fencekit chaos: {c.duration:g}s, seed {c.seed}, {c.workers} workers, {c.resources} "
        f"resources, lease ttl {c.ttl:g}s, {fence}, issuer {issuer}{extra}"
    )


def _header(res: ChaosResult, env: Environment) -> str:
    return (
        f"{_header_line(res.config, env)}\n"
        f"server: {res.server}; took {res.seconds:.1f}s\n"
        f"workers: role {res.worker_role} (not a superuser: DML on the chaos tables and "
        "fencekit_writer; dropped after the run)\n"
    )


def _verdict(res: ChaosResult) -> str:
    r = res.report
    gap = ""
    if r.scope != "lease-bound" and r.gap_lost_updates:
        gap = (
            f"\n{GAP}: {r.gap_lost_updates} lost update(s) that fencing alone cannot prevent "
            f"in {r.scope} scope: {GAP_CLOSES}."
        )
    if res.config.issuer_factory:
        if res.ok:
            return f"\nAs expected with a broken issuer: {_kinds(r)}.{gap}"
        return f"\nUNEXPECTED: the broken issuer passed the checker.{gap}"
    if res.config.fence:
        if res.ok:
            return (
                f"\nOK: no violation; {r.stale_rejected} of {r.stale_attempted} stale writes "
                f"rejected, {r.crashes} crashes survived.{gap}"
            )
        return f"\nFAILED: {_kinds(r)} with fencing on.{gap}"
    if res.ok:
        return (
            f"\nAs expected without fencing: {len(r.violations)} violation(s), "
            f"{r.lost_updates} lost update(s). Run without --no-fence to see them rejected."
        )
    return "\nUNEXPECTED: no violation without fencing (run longer, or with more pauses)."


def _kinds(r: Report) -> str:
    kinds = ", ".join(f"{k} x{n}" for k, n in sorted(r.by_kind.items()))
    return f"{len(r.violations)} violation(s): {kinds}"
