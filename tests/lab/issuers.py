"""Throwaway etcd clusters and ZooKeeper ensembles on loopback, for the issuer tests.

Both are started from Debian's packages (``etcd-server`` 3.4, ``zookeeper`` 3.8) as plain
child processes of the test run, on free ports of 127.0.0.1, with their data and logs in a
temporary directory.  Nothing here talks to any address but loopback.

* :class:`EtcdCluster` -- a three-member etcd cluster; helpers find and kill the leader
  (SIGKILL, the way a crashed machine goes) and restart a member from its data directory.
* :class:`ZooKeeperEnsemble` -- a three-server ZooKeeper ensemble (``size=1`` for a single
  standalone server), each JVM with a small heap, so it fits the 2-core machine.

Starting waits for health (every member answers and there is a leader) and raises
:class:`ServerStartError` with the tail of each member's log when it does not come.
Stopping sends SIGTERM, then SIGKILL after a grace period, and waits for every process, so
nothing is left running after a test session.

Usable outside pytest::

    with EtcdCluster(tmpdir) as cluster:
        print(cluster.endpoints)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from tests.lab.ports import LOOPBACK, free_ports


class ServerStartError(RuntimeError):
    """A test server did not become healthy in time (the message carries its logs)."""


class ServerBinaryMissing(RuntimeError):
    """The server program is not installed."""


# --------------------------------------------------------------------------- helpers


def _port_open(port: int, timeout: float = 0.3) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=timeout):
            return True
    except OSError:
        return False


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"(no log: {exc})"
    return "\n".join(text[-lines:])


def _proc_state(proc: subprocess.Popen[bytes] | None) -> str:
    if proc is None:
        return "not started"
    rc = proc.poll()
    return "running" if rc is None else f"exited with {rc}"


def _stop_process(proc: subprocess.Popen[bytes] | None, grace: float = 5.0) -> None:
    """SIGTERM, wait ``grace`` seconds, SIGKILL, and reap.  Safe on dead processes."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(timeout=10)


def _kill_process(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL and reap: the process gets no chance to hand anything over."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    proc.wait(timeout=10)


def etcd_binary() -> str:
    """Path of the ``etcd`` server program, or :class:`ServerBinaryMissing`."""
    path = shutil.which(os.environ.get("FENCEKIT_ETCD_BIN") or "etcd")
    if not path:
        raise ServerBinaryMissing(
            "etcd server not found (install Debian's etcd-server package: "
            "apt-get install -y etcd-server etcd-client, or set FENCEKIT_ETCD_BIN)"
        )
    return path


ZOOKEEPER_JAR = "/usr/share/java/zookeeper.jar"
# slf4j-simple writes ZooKeeper's log to stderr, which goes to the member's log file.
_SLF4J_SIMPLE = "/usr/share/java/slf4j-simple.jar"


def zookeeper_classpath() -> str:
    """Class path for Debian's ZooKeeper server, or :class:`ServerBinaryMissing`.

    Debian's ``zookeeper.jar`` names its dependencies in its manifest's Class-Path.
    """
    jar = os.environ.get("FENCEKIT_ZOOKEEPER_JAR", ZOOKEEPER_JAR)
    java = shutil.which("java")
    if not Path(jar).is_file() or not java:
        raise ServerBinaryMissing(
            f"ZooKeeper server not found ({jar} or java missing; install Debian's "
            "zookeeper package: apt-get install -y zookeeper, or set FENCEKIT_ZOOKEEPER_JAR)"
        )
    parts = [jar]
    if Path(_SLF4J_SIMPLE).is_file():
        parts.append(_SLF4J_SIMPLE)
    return ":".join(parts)


# --------------------------------------------------------------------------- etcd


@dataclass
class EtcdMember:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    log_file: IO[bytes] | None = field(default=None, repr=False)

    @property
    def endpoint(self) -> str:
        return f"{LOOPBACK}:{self.client_port}"

    @property
    def client_url(self) -> str:
        return f"http://{LOOPBACK}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{LOOPBACK}:{self.peer_port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class EtcdCluster:
    """A ``size``-member etcd cluster on loopback (three by default)."""

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        size: int = 3,
        *,
        binary: str | None = None,
        cluster_token: str = "fencekit-test",
        election_ms: int = 1000,
    ) -> None:
        """``election_ms``: etcd's election timeout (heartbeat a tenth of it); etcd's minimum
        lease TTL follows it (1 s at 500 ms, as the chaos run wants)."""
        self.election_ms = election_ms
        self.base_dir = Path(base_dir)
        self.size = size
        self.binary = binary or etcd_binary()
        self.cluster_token = cluster_token
        ports = free_ports(2 * size)
        self.members = [
            EtcdMember(
                name=f"etcd{i}",
                client_port=ports[2 * i],
                peer_port=ports[2 * i + 1],
                data_dir=self.base_dir / f"etcd{i}.data",
                log_path=self.base_dir / f"etcd{i}.log",
            )
            for i in range(size)
        ]

    # -- addresses
    @property
    def endpoints(self) -> list[str]:
        """``host:port`` of every member's client URL."""
        return [m.endpoint for m in self.members]

    @property
    def initial_cluster(self) -> str:
        return ",".join(f"{m.name}={m.peer_url}" for m in self.members)

    # -- life cycle
    def _launch(self, member: EtcdMember) -> None:
        member.data_dir.mkdir(parents=True, exist_ok=True)
        state = "existing" if (member.data_dir / "member").exists() else "new"
        args = [
            self.binary,
            "--name",
            member.name,
            "--data-dir",
            str(member.data_dir),
            "--listen-client-urls",
            member.client_url,
            "--advertise-client-urls",
            member.client_url,
            "--listen-peer-urls",
            member.peer_url,
            "--initial-advertise-peer-urls",
            member.peer_url,
            "--initial-cluster",
            self.initial_cluster,
            "--initial-cluster-state",
            state,
            "--initial-cluster-token",
            self.cluster_token,
            # Fast elections keep the leader-kill test short; fine on loopback.
            "--heartbeat-interval",
            str(self.election_ms // 10),
            "--election-timeout",
            str(self.election_ms),
            "--logger",
            "zap",
            "--log-outputs",
            "stderr",
            "--snapshot-count",
            "10000",
            "--quota-backend-bytes",
            str(256 * 1024 * 1024),
        ]
        member.log_file = open(member.log_path, "ab")  # noqa: SIM115 - closed in _reap
        member.log_file.write(
            f"\n=== start {time.strftime('%H:%M:%S')} {' '.join(args)}\n".encode()
        )
        member.log_file.flush()
        member.proc = subprocess.Popen(  # noqa: S603 - fixed argv
            args,
            stdout=member.log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def _reap(self, member: EtcdMember) -> None:
        if member.log_file is not None:
            member.log_file.close()
            member.log_file = None

    def start(self, timeout: float = 30.0) -> EtcdCluster:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        for m in self.members:
            self._launch(m)
        try:
            self.wait_healthy(timeout=timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for m in self.members:
            _stop_process(m.proc)
            self._reap(m)

    def __enter__(self) -> EtcdCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- health and roles
    def _get_json(
        self,
        member: EtcdMember,
        path: str,
        body: dict[str, object] | None = None,
        timeout: float = 1.0,
    ) -> dict[str, object]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            member.client_url + path, data=data, method="POST" if data else "GET"
        )
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - loopback only
            return json.loads(resp.read())

    def member_healthy(self, member: EtcdMember) -> bool:
        if not member.running:
            return False
        try:
            # /health answers true only when the member sees a leader and can serve
            # a quorum read.
            return self._get_json(member, "/health").get("health") in (True, "true")
        except (OSError, ValueError, urllib.error.URLError):
            return False

    def status(self, member: EtcdMember) -> dict[str, object]:
        return self._get_json(member, "/v3/maintenance/status", {})

    def _fail(self, what: str) -> ServerStartError:
        logs = "\n".join(
            f"--- {m.name} ({_proc_state(m.proc)}) log {m.log_path}:\n{_tail(m.log_path)}"
            for m in self.members
        )
        return ServerStartError(f"etcd cluster: {what}\n{logs}")

    def wait_healthy(self, timeout: float = 30.0, members: list[EtcdMember] | None = None) -> None:
        """Wait until every given (default: every running) member is healthy."""
        deadline = time.monotonic() + timeout
        targets = members if members is not None else [m for m in self.members if m.running]
        while True:
            dead = [m for m in targets if not m.running]
            if dead:
                raise self._fail(f"member(s) {[m.name for m in dead]} exited during start")
            if all(self.member_healthy(m) for m in targets):
                return
            if time.monotonic() > deadline:
                raise self._fail(f"not healthy after {timeout:.0f}s")
            time.sleep(0.2)

    def leader(self, timeout: float = 15.0) -> EtcdMember:
        """The member the running members agree is leader (waits for an election)."""
        deadline = time.monotonic() + timeout
        while True:
            by_id: dict[str, EtcdMember] = {}
            leaders: set[str] = set()
            for m in self.members:
                if not m.running:
                    continue
                try:
                    st = self.status(m)
                except (OSError, ValueError, urllib.error.URLError):
                    continue
                header = st.get("header", {})
                assert isinstance(header, dict)
                by_id[str(header.get("member_id"))] = m
                if st.get("leader") not in (None, "0", 0):
                    leaders.add(str(st["leader"]))
            if len(leaders) == 1:
                (lid,) = leaders
                if lid in by_id and by_id[lid].running:
                    return by_id[lid]
            if time.monotonic() > deadline:
                raise self._fail(f"no agreed leader after {timeout:.0f}s (saw {leaders})")
            time.sleep(0.1)

    def kill_member(self, member: EtcdMember) -> None:
        """SIGKILL one member (no graceful leadership transfer)."""
        _kill_process(member.proc)
        self._reap(member)

    def kill_leader(self) -> EtcdMember:
        """SIGKILL the current leader and return it (restart it with :meth:`restart_member`)."""
        leader = self.leader()
        self.kill_member(leader)
        return leader

    def restart_member(self, member: EtcdMember, timeout: float = 30.0) -> None:
        """Start a stopped member again from its data directory and wait until it is healthy."""
        if member.running:
            raise RuntimeError(f"{member.name} is still running")
        self._launch(member)
        self.wait_healthy(timeout=timeout, members=[member])


# --------------------------------------------------------------------------- ZooKeeper


@dataclass
class ZooKeeperServer:
    myid: int
    client_port: int
    quorum_port: int
    election_port: int
    data_dir: Path
    conf_path: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    log_file: IO[bytes] | None = field(default=None, repr=False)

    @property
    def endpoint(self) -> str:
        return f"{LOOPBACK}:{self.client_port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class ZooKeeperEnsemble:
    """A ZooKeeper ensemble of ``size`` servers on loopback (3 by default; 1 = standalone).

    ``tick_ms`` is small so that short session timeouts are allowed: ZooKeeper clamps a
    client's session timeout into [2, 20] ticks.  Each JVM gets ``heap_mb`` of heap.
    """

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        size: int = 3,
        *,
        tick_ms: int = 200,
        heap_mb: int = 96,
    ) -> None:
        self.base_dir = Path(base_dir)
        self.size = size
        self.tick_ms = tick_ms
        self.heap_mb = heap_mb
        self.classpath = zookeeper_classpath()
        self.java = shutil.which("java") or "java"
        ports = free_ports(3 * size)
        self.servers = [
            ZooKeeperServer(
                myid=i + 1,
                client_port=ports[3 * i],
                quorum_port=ports[3 * i + 1],
                election_port=ports[3 * i + 2],
                data_dir=self.base_dir / f"zk{i + 1}.data",
                conf_path=self.base_dir / f"zk{i + 1}.cfg",
                log_path=self.base_dir / f"zk{i + 1}.log",
            )
            for i in range(size)
        ]

    @property
    def hosts(self) -> str:
        """kazoo ``hosts`` string: every server's client address."""
        return ",".join(s.endpoint for s in self.servers)

    @property
    def min_session_timeout(self) -> float:
        return 2 * self.tick_ms / 1000

    @property
    def max_session_timeout(self) -> float:
        return 20 * self.tick_ms / 1000

    def _write_config(self, server: ZooKeeperServer) -> None:
        server.data_dir.mkdir(parents=True, exist_ok=True)
        lines = [
            f"tickTime={self.tick_ms}",
            "initLimit=50",
            "syncLimit=10",
            f"dataDir={server.data_dir}",
            f"clientPort={server.client_port}",
            f"clientPortAddress={LOOPBACK}",
            "admin.enableServer=false",
            "4lw.commands.whitelist=srvr,ruok,stat,mntr",
            "maxClientCnxns=200",
            "autopurge.purgeInterval=0",
            "preAllocSize=4096",
            "snapCount=100000",
        ]
        if self.size > 1:
            (server.data_dir / "myid").write_text(f"{server.myid}\n")
            lines.append("electionPortBindRetry=10")
            for s in self.servers:
                lines.append(f"server.{s.myid}={LOOPBACK}:{s.quorum_port}:{s.election_port}")
        server.conf_path.write_text("\n".join(lines) + "\n")

    def _launch(self, server: ZooKeeperServer) -> None:
        self._write_config(server)
        main = (
            "org.apache.zookeeper.server.quorum.QuorumPeerMain"
            if self.size > 1
            else "org.apache.zookeeper.server.ZooKeeperServerMain"
        )
        args = [
            self.java,
            f"-Xmx{self.heap_mb}m",
            f"-Xms{min(32, self.heap_mb)}m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Xss512k",
            "-Dzookeeper.jmx.log4j.disable=true",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=info",
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
            "-cp",
            self.classpath,
            main,
            str(server.conf_path),
        ]
        server.log_file = open(server.log_path, "ab")  # noqa: SIM115 - closed in _reap
        server.log_file.write(
            f"\n=== start {time.strftime('%H:%M:%S')} {' '.join(args)}\n".encode()
        )
        server.log_file.flush()
        server.proc = subprocess.Popen(  # noqa: S603 - fixed argv
            args,
            stdout=server.log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def _reap(self, server: ZooKeeperServer) -> None:
        if server.log_file is not None:
            server.log_file.close()
            server.log_file = None

    def four_letter(self, server: ZooKeeperServer, cmd: str, timeout: float = 1.0) -> str:
        with socket.create_connection((LOOPBACK, server.client_port), timeout=timeout) as s:
            s.sendall(cmd.encode())
            chunks = []
            while True:
                data = s.recv(4096)
                if not data:
                    break
                chunks.append(data)
        return b"".join(chunks).decode(errors="replace")

    def mode(self, server: ZooKeeperServer) -> str | None:
        """'leader', 'follower', 'standalone', or None when not serving."""
        if not server.running:
            return None
        try:
            out = self.four_letter(server, "srvr")
        except OSError:
            return None
        for line in out.splitlines():
            if line.startswith("Mode:"):
                return line.split(":", 1)[1].strip()
        return None

    def _fail(self, what: str) -> ServerStartError:
        logs = "\n".join(
            f"--- zk{s.myid} ({_proc_state(s.proc)}) log {s.log_path}:\n{_tail(s.log_path)}"
            for s in self.servers
        )
        return ServerStartError(f"ZooKeeper ensemble: {what}\n{logs}")

    def wait_healthy(
        self, timeout: float = 60.0, servers: list[ZooKeeperServer] | None = None
    ) -> None:
        deadline = time.monotonic() + timeout
        targets = servers if servers is not None else [s for s in self.servers if s.running]
        while True:
            dead = [s for s in targets if not s.running]
            if dead:
                raise self._fail(f"server(s) {[s.myid for s in dead]} exited during start")
            modes = [self.mode(s) for s in targets]
            if all(m in ("leader", "follower", "standalone") for m in modes):
                return
            if time.monotonic() > deadline:
                raise self._fail(f"not serving after {timeout:.0f}s (modes {modes})")
            time.sleep(0.2)

    def start(self, timeout: float = 60.0) -> ZooKeeperEnsemble:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        for s in self.servers:
            self._launch(s)
        try:
            self.wait_healthy(timeout=timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for s in self.servers:
            _stop_process(s.proc)
            self._reap(s)

    def __enter__(self) -> ZooKeeperEnsemble:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def leader(self) -> ZooKeeperServer | None:
        for s in self.servers:
            if self.mode(s) in ("leader", "standalone"):
                return s
        return None

    def kill_server(self, server: ZooKeeperServer) -> None:
        """SIGKILL one server (the way a crashed machine goes)."""
        _kill_process(server.proc)
        self._reap(server)

    def stop_server(self, server: ZooKeeperServer) -> None:
        _stop_process(server.proc)
        self._reap(server)

    def restart_server(self, server: ZooKeeperServer, timeout: float = 60.0) -> None:
        if server.running:
            raise RuntimeError(f"zk{server.myid} is still running")
        self._launch(server)
        self.wait_healthy(timeout=timeout, servers=[server])

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """SIGSTOP every server (the whole ensemble unreachable, sessions frozen), then SIGCONT."""
        stopped = []
        try:
            for s in self.servers:
                if s.running and s.proc is not None:
                    os.kill(s.proc.pid, signal.SIGSTOP)
                    stopped.append(s)
            yield
        finally:
            for s in stopped:
                if s.proc is not None and s.proc.poll() is None:
                    os.kill(s.proc.pid, signal.SIGCONT)


if __name__ == "__main__":  # pragma: no cover - manual smoke run
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        t0 = time.monotonic()
        which = sys.argv[1] if len(sys.argv) > 1 else "both"
        if which in ("etcd", "both"):
            with EtcdCluster(Path(d) / "etcd") as c:
                print(
                    "etcd up",
                    c.endpoints,
                    "leader",
                    c.leader().name,
                    f"{time.monotonic() - t0:.1f}s",
                )
                old = c.kill_leader()
                print(
                    "killed",
                    old.name,
                    "new leader",
                    c.leader().name,
                    f"{time.monotonic() - t0:.1f}s",
                )
                c.restart_member(old)
                print("restarted", old.name, f"{time.monotonic() - t0:.1f}s")
        if which in ("zk", "both"):
            t0 = time.monotonic()
            with ZooKeeperEnsemble(Path(d) / "zk") as z:
                print(
                    "zk up",
                    z.hosts,
                    [z.mode(s) for s in z.servers],
                    f"{time.monotonic() - t0:.1f}s",
                )
