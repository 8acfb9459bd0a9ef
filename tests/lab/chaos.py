"""The lab's chaos run: fencekit's run (:mod:`fencekit.chaos.run`) on servers the lab starts,
with the faults only such servers allow.

- **crash**: the run's own PostgreSQL (Debian's binaries, durable commits) is shut down with
  ``pg_ctl stop -m immediate`` and started again (recovery from the WAL); with pgbouncer,
  pgbouncer is restarted while the server is down.
- **net** (``--net-faults``, implies ``--pgbouncer``): pgbouncer is SIGSTOPped for 1.5 to 2.5 s
  with commits in flight, so their writers do not know whether they landed.
- **clock** (``--clock-faults``): libfaketime steps the workers' or the server's clock forward
  or back, runs it fast or slow, or freezes the workers' clock, for 1 to 3 s.
- **node** (``--issuer etcd|zookeeper``): a three-node cluster on loopback whose leader is
  killed (restarted 1 to 2 s later) or one of whose members is paused for 1 to 2.5 s.

``python -m tests.lab chaos --help``; docs/chaos.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from fencekit.chaos.nemesis import Fault, Nemesis
from fencekit.chaos.run import ChaosConfig, Environment, Target, WorkerRole
from fencekit.embedded import EmbeddedServerError
from fencekit.errors import ChaosSetupError
from tests.lab.clocks import FakeClock, find_libfaketime
from tests.lab.issuers import EtcdCluster, ServerBinaryMissing, ZooKeeperEnsemble
from tests.lab.pgbouncer import PgBouncer, pgbouncer_binary
from tests.lab.postgres import ClusterServer, ServerUnavailable, start_cluster

_VERSIONS = (15, 16, 17, 14)  # 15 first: the version the project's CI installs


def find_bindir() -> Path | None:
    """A directory holding ``initdb`` and ``pg_ctl``: ``FENCEKIT_PG_BINDIR`` or Debian's."""
    env = os.environ.get("FENCEKIT_PG_BINDIR")
    candidates = [Path(env)] if env else []
    candidates += [Path(f"/usr/lib/postgresql/{v}/bin") for v in _VERSIONS]
    for c in candidates:
        if (c / "pg_ctl").exists() and (c / "initdb").exists():
            return c
    return None


@dataclass
class LabOptions:
    crashes: bool = True
    pgbouncer: bool = False
    clock_faults: bool = False
    net_faults: bool = False


# ---------------------------------------------------------------- faults


class CrashFault(Fault):
    kind = "crash"
    weight = 1.0
    due = 0.45  # a short run still proves recovery

    def __init__(self, server: ClusterServer, bouncer: PgBouncer | None, seconds: float) -> None:
        self.server, self.bouncer = server, bouncer
        self.gap = max(3.0, seconds / 4)
        self.last: float | None = None  # monotonic time of the last crash

    def ready(self, elapsed: float, remaining: float) -> bool:
        now = time.monotonic()
        if self.last is None:  # as if one happened half a gap before the run
            self.last = now - elapsed - self.gap / 2
        # No crash in the last seconds: the run must also show writes after recovery.
        return now - self.last >= self.gap and remaining > 3

    def inject(self, nemesis: Nemesis) -> None:
        nemesis.progress("nemesis: crash-restarting PostgreSQL (immediate shutdown)")
        nemesis.undo_now("net")  # a paused pgbouncer cannot be restarted: resume it first
        self.server.crash()
        nemesis.history.append("crash")
        nemesis.reconnect()
        if self.bouncer is not None:
            self.bouncer.halt()
            self.bouncer.start()
            nemesis.history.append("bouncer", action="restart")
        time.sleep(nemesis.rng.uniform(0.1, 0.5))
        started = time.monotonic()
        self.server.restart()
        nemesis.history.append("restart")
        nemesis.progress(f"nemesis: PostgreSQL back after {time.monotonic() - started:.1f}s")
        self.last = time.monotonic()
        return None


class NetFault(Fault):
    kind = "net"
    due = 0.2

    def __init__(self, bouncer: PgBouncer) -> None:
        self.bouncer = bouncer

    def inject(self, nemesis: Nemesis) -> tuple[float, Callable[[], None]] | None:
        nemesis.history.append("net", fault="pgbouncer paused (SIGSTOP)")  # before it happens
        if not self.bouncer.pause():
            nemesis.history.append("net", fault=None, action="pgbouncer not running")
            return None

        def undo() -> None:
            self.bouncer.resume()
            nemesis.history.append("net", fault=None, action="pgbouncer resumed (SIGCONT)")

        return nemesis.rng.uniform(1.5, 2.5), undo


class ClockFault(Fault):
    weight = 0.75  # two clocks: 1.5 between them, as one fault

    def __init__(self, fake: FakeClock, due: float) -> None:
        self.fake = fake
        self.kind = f"clock:{fake.target}"
        self.due = due

    def inject(self, nemesis: Nemesis) -> tuple[float, Callable[[], None]]:
        target = self.fake.target
        # A frozen server clock stalls every lease; freezing is for the workers' clocks.
        kind, what = self.fake.random_fault(nemesis.rng, nemesis.ttl, freeze=target == "workers")
        # Recorded before it takes effect, put right before "put right" is recorded: the
        # history's fault window always covers the clock's wrong time.
        nemesis.history.append("clock", target=target, fault=kind, what=what)
        self.fake.tick()

        def undo() -> None:
            self.fake.reset()
            nemesis.history.append("clock", target=target, fault=None, what="put right")

        return nemesis.rng.uniform(1.0, 3.0), undo

    def tick(self) -> None:
        self.fake.tick()


class NodeFault(Fault):
    """Kill the issuer cluster's leader (restarted later) or pause one member."""

    kind = "node"
    due = 0.44

    def __init__(self, cluster: EtcdCluster | ZooKeeperEnsemble) -> None:
        self.cluster = cluster

    def _nodes(self) -> list[Any]:
        c = self.cluster
        return list(c.members if isinstance(c, EtcdCluster) else c.servers)

    @staticmethod
    def _name(node: Any) -> str:
        return str(getattr(node, "name", None) or f"zk{node.myid}")

    def inject(self, nemesis: Nemesis) -> tuple[float, Callable[[], None]] | None:
        c: Any = self.cluster
        leader = None
        if nemesis.rng.random() < 0.5:
            try:
                leader = c.leader(timeout=2.0) if isinstance(c, EtcdCluster) else c.leader()
            except Exception:  # no agreed leader right now: pause a member instead
                leader = None
        if leader is not None:
            if isinstance(c, EtcdCluster):
                c.kill_member(leader)
            else:
                c.kill_server(leader)
            name = self._name(leader)
            nemesis.history.append("node", fault="leader killed (SIGKILL)", node=name)

            def restart() -> None:
                try:
                    if isinstance(c, EtcdCluster):
                        c.restart_member(leader, timeout=30)
                    else:
                        c.restart_server(leader, timeout=30)
                except Exception as exc:  # the run goes on with two members
                    nemesis.progress(f"nemesis: {name} did not come back: {exc}")
                nemesis.history.append("node", fault=None, action="restarted", node=name)

            return nemesis.rng.uniform(1.0, 2.0), restart
        member = nemesis.rng.choice([n for n in self._nodes() if n.running])
        name = self._name(member)
        # Recorded before it takes effect: the checker's window (a paused etcd member is a
        # fault of etcd's clock, in releases with etcd-io/etcd#15247) covers the whole pause.
        nemesis.history.append("node", fault="member paused (SIGSTOP)", node=name, pause=True)
        os.kill(member.proc.pid, signal.SIGSTOP)

        def resume() -> None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(member.proc.pid, signal.SIGCONT)
            nemesis.history.append("node", fault=None, action="resumed", node=name)

        return nemesis.rng.uniform(1.0, 2.5), resume


# ---------------------------------------------------------------- the environment


class LabEnvironment(Environment):
    """Servers the lab starts for one run, and the faults they allow."""

    def __init__(self, options: LabOptions, cfg: ChaosConfig) -> None:
        super().__init__()
        self.options = options
        self.cfg = cfg
        self.server: ClusterServer | None = None
        self.bouncer: PgBouncer | None = None
        self.clocks: dict[str, FakeClock] = {}
        self.cluster: EtcdCluster | ZooKeeperEnsemble | None = None
        self._tmp = Path(tempfile.mkdtemp(prefix="fencekit-lab-chaos-"))

    def target(
        self, cfg: ChaosConfig, stack: contextlib.ExitStack, say: Callable[[str], None]
    ) -> Target:
        stack.callback(shutil.rmtree, self._tmp, ignore_errors=True)
        o = self.options
        if o.clock_faults:
            library = find_libfaketime()
            if library is None:
                raise ChaosSetupError(
                    "--clock-faults needs libfaketime: apt-get install faketime "
                    "(or set FENCEKIT_LIBFAKETIME)"
                )
            for name in ("workers", "server"):
                self.clocks[name] = FakeClock(name, library)
                stack.callback(self.clocks[name].close)
            self.worker_env = self.clocks["workers"].env()
        if cfg.issuer != "postgres" and not cfg.endpoints:
            say(f"starting a three-node {cfg.issuer} cluster on loopback...")
            try:
                if cfg.issuer == "etcd":
                    self.cluster = EtcdCluster(self._tmp / "etcd", election_ms=500)
                else:
                    self.cluster = ZooKeeperEnsemble(self._tmp / "zk")
            except ServerBinaryMissing as exc:
                raise ChaosSetupError(str(exc)) from exc
            self.cluster.start()
            stack.callback(self.cluster.stop)
            if isinstance(self.cluster, EtcdCluster):
                self.endpoints = ",".join(self.cluster.endpoints)
            else:
                self.endpoints = self.cluster.hosts
        if cfg.dsn:
            if "server" in self.clocks:
                self.clocks.pop("server").close()
                self.notes.append("clock faults on the workers only: the run did not start --dsn")
            self.notes.append("no crash-restart: the run does not control --dsn's server")
            return super().target(cfg, stack, say)
        bindir = find_bindir() if o.crashes else None
        if bindir is None:
            if o.crashes:
                raise ChaosSetupError(
                    "crash-restarts need PostgreSQL's binaries: apt-get install postgresql-15 "
                    "(or FENCEKIT_PG_BINDIR), or run with --no-crash"
                )
            if "server" in self.clocks:
                self.clocks.pop("server").close()
                self.notes.append("clock faults on the workers only: the embedded server")
            self.notes.append("no crash-restart (--no-crash)")
            return super().target(cfg, stack, say)
        server_env = self.clocks["server"].env() if "server" in self.clocks else None
        say(f"starting a throwaway PostgreSQL {bindir.parent.name} (durable commits)...")
        try:
            self.server = start_cluster(
                bindir, f"PostgreSQL {bindir.parent.name}", durable=True, env=server_env
            )
        except (EmbeddedServerError, ServerUnavailable) as exc:
            raise ChaosSetupError(str(exc)) from exc
        stack.callback(self.server.stop)
        s = self.server
        return Target(
            s.dsn, s.host, s.port, s.user, f"PostgreSQL {s.version}, controlled (crash-restart)"
        )

    def worker_dsn(
        self, stack: contextlib.ExitStack, target: Target, dsn: str, role: WorkerRole
    ) -> str:
        if not (self.options.pgbouncer or self.options.net_faults):
            return super().worker_dsn(stack, target, dsn, role)
        if pgbouncer_binary() is None:
            raise ChaosSetupError("--pgbouncer needs pgbouncer: apt-get install pgbouncer")
        handle = self.server or _Handle(target)
        bouncer = PgBouncer(
            handle,  # type: ignore[arg-type]
            pool_size=20,
            users={role.name: role.password},
            # Retry the server soon after it comes back (default: 15 s after a failed login),
            # and never queue a client for long while it is down.
            settings={"server_login_retry": "1", "query_wait_timeout": "5"},
        )
        stack.callback(bouncer.stop)
        dbname = str(conninfo_to_dict(dsn)["dbname"])
        bouncer.start(wait_dsn=bouncer.dsn_for(dbname))
        self.bouncer = bouncer
        return make_conninfo(bouncer.dsn_for(dbname), user=role.name, password=role.password)

    def faults(self) -> list[Fault]:
        out: list[Fault] = []
        if self.server is not None:
            out.append(CrashFault(self.server, self.bouncer, self.cfg.duration))
        if self.options.net_faults and self.bouncer is not None:
            out.append(NetFault(self.bouncer))
        for i, fake in enumerate(self.clocks.values()):
            out.append(ClockFault(fake, due=0.32 + 0.04 * i))
        if self.cluster is not None:
            out.append(NodeFault(self.cluster))
        return out

    def describe(self) -> dict[str, object]:
        return {
            "clock_faults": sorted(self.clocks),
            "net_faults": self.options.net_faults,
            "crashes": self.server is not None,
        }

    def summary(self) -> str:
        o = self.options
        on = [
            name for name, flag in (("clocks", o.clock_faults), ("network", o.net_faults)) if flag
        ]
        bouncer = "; workers through pgbouncer (transaction mode)" if self.bouncer else ""
        return (f", faults also on {' and '.join(on)}" if on else "") + bouncer

    def after_run(self) -> None:
        if self.server is not None and not self.server.running:
            self.server.restart()


@dataclass
class _Handle:
    """The attributes of a server handle pgbouncer needs, for a --dsn target."""

    target: Target

    @property
    def host(self) -> str:
        return self.target.host

    @property
    def port(self) -> int:
        return self.target.port

    @property
    def user(self) -> str:
        return self.target.user


# ---------------------------------------------------------------- the command


def add_lab_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-crash", dest="crashes", action="store_false", help="never crash the server"
    )
    p.add_argument(
        "--pgbouncer",
        action="store_true",
        help="workers connect through a pgbouncer (transaction mode) that the run starts",
    )
    p.add_argument(
        "--clock-faults",
        action="store_true",
        help="libfaketime steps, skews and freezes the workers' and the server's clocks "
        "(Debian package faketime)",
    )
    p.add_argument(
        "--net-faults",
        action="store_true",
        help="pause pgbouncer (SIGSTOP) with commits in flight: indeterminate writes "
        "(implies --pgbouncer)",
    )


def options_from_args(args: argparse.Namespace) -> LabOptions:
    return LabOptions(
        crashes=args.crashes,
        pgbouncer=args.pgbouncer or args.net_faults,
        clock_faults=args.clock_faults,
        net_faults=args.net_faults,
    )


def cli_run(args: argparse.Namespace) -> int:
    """``python -m tests.lab chaos``: fencekit chaos's options plus the lab's."""
    from fencekit.cli.chaos import config_from_args, run

    try:
        cfg = config_from_args(args)
    except ValueError as exc:
        print(f"chaos: {exc}")
        return 2
    return run(args, environment=LabEnvironment(options_from_args(args), cfg))
