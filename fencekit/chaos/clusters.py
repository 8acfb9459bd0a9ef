"""Three-node etcd clusters and ZooKeeper ensembles on loopback, for ``--issuer etcd|zookeeper``.

Started from Debian's packages (``etcd-server``; ``zookeeper`` with a JVM) as child processes
on free ports of 127.0.0.1, data in a temp directory, stopped and removed at the end of the run.
The nemesis kills the leader (SIGKILL, then a restart from its data directory) and pauses
members (SIGSTOP, then SIGCONT). Nothing listens on any address but loopback.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import IO

from fencekit.chaos.server import ServerError

__all__ = ["Cluster", "EtcdCluster", "ZooKeeperEnsemble", "start_cluster"]

_LOOPBACK = "127.0.0.1"


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((_LOOPBACK, 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


class _Node:
    def __init__(self, name: str, log: Path) -> None:
        self.name = name
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def launch(self, argv: list[str]) -> None:
        fh: IO[bytes] = open(self.log, "ab")  # noqa: SIM115  # the child owns it
        try:
            self.proc = subprocess.Popen(
                argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        finally:
            fh.close()

    def signal(self, sig: signal.Signals) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(10)
        self.paused = False

    def tail(self) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-15:])
        return ""


class Cluster:
    """What the nemesis needs of an issuer's cluster."""

    kind = ""
    nodes: list[_Node]

    def __init__(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix=f"fencekit-chaos-{self.kind}-"))

    @property
    def endpoints(self) -> str:
        raise NotImplementedError

    def _argv(self, i: int) -> list[str]:
        raise NotImplementedError

    def healthy(self, node: _Node) -> bool:
        raise NotImplementedError

    def is_leader(self, node: _Node) -> bool:
        raise NotImplementedError

    def start(self, timeout: float = 60) -> None:
        for i, node in enumerate(self.nodes):
            node.launch(self._argv(i))
        self.wait(self.nodes, timeout)

    def wait(self, nodes: list[_Node], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not all(n.running and self.healthy(n) for n in nodes):
            if time.monotonic() > deadline or not all(n.running for n in nodes):
                logs = "\n".join(f"--- {n.name}:\n{n.tail()}" for n in nodes)
                raise ServerError(f"{self.kind} cluster did not become healthy:\n{logs}")
            time.sleep(0.2)

    def leader(self) -> _Node | None:
        for n in self.nodes:
            if n.running and not n.paused and self.is_leader(n):
                return n
        return None

    def restart(self, node: _Node, timeout: float = 60) -> None:
        node.launch(self._argv(self.nodes.index(node)))
        self.wait([node], timeout)

    def stop(self) -> None:
        for n in self.nodes:
            n.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)


class EtcdCluster(Cluster):
    kind = "etcd"

    def __init__(self) -> None:
        super().__init__()
        binary = shutil.which(os.environ.get("FENCEKIT_ETCD_BIN") or "etcd")
        if binary is None:
            raise ServerError("--issuer etcd needs etcd: apt-get install etcd-server")
        self.binary = binary
        ports = _free_ports(6)
        self.client = ports[0::2]
        self.peer = ports[1::2]
        self.nodes = [_Node(f"etcd{i}", self.tmp / f"etcd{i}.log") for i in range(3)]

    @property
    def endpoints(self) -> str:
        return ",".join(f"{_LOOPBACK}:{p}" for p in self.client)

    def _argv(self, i: int) -> list[str]:
        data = self.tmp / f"etcd{i}.data"
        cluster = ",".join(f"etcd{j}=http://{_LOOPBACK}:{p}" for j, p in enumerate(self.peer))
        return [
            self.binary, "--name", f"etcd{i}", "--data-dir", str(data),
            "--listen-client-urls", f"http://{_LOOPBACK}:{self.client[i]}",
            "--advertise-client-urls", f"http://{_LOOPBACK}:{self.client[i]}",
            "--listen-peer-urls", f"http://{_LOOPBACK}:{self.peer[i]}",
            "--initial-advertise-peer-urls", f"http://{_LOOPBACK}:{self.peer[i]}",
            "--initial-cluster", cluster,
            "--initial-cluster-state", "existing" if (data / "member").exists() else "new",
            "--initial-cluster-token", "fencekit-chaos",
            # Fast elections on loopback; etcd's minimum lease TTL follows (1 s here).
            "--heartbeat-interval", "50", "--election-timeout", "500",
            "--logger", "zap", "--log-outputs", "stderr",
        ]  # fmt: skip

    def _get(self, i: int, path: str, body: dict[str, object] | None = None) -> dict[str, object]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://{_LOOPBACK}:{self.client[i]}{path}", data=data)
        with urllib.request.urlopen(req, timeout=1.0) as resp:  # noqa: S310  # loopback
            out: dict[str, object] = json.loads(resp.read())
            return out

    def healthy(self, node: _Node) -> bool:
        try:
            return self._get(self.nodes.index(node), "/health").get("health") in (True, "true")
        except (OSError, ValueError):
            return False

    def is_leader(self, node: _Node) -> bool:
        try:
            st = self._get(self.nodes.index(node), "/v3/maintenance/status", {})
        except (OSError, ValueError):
            return False
        header = st.get("header")
        return isinstance(header, dict) and str(header.get("member_id")) == str(st.get("leader"))


class ZooKeeperEnsemble(Cluster):
    kind = "zookeeper"
    tick_ms = 200  # session timeouts of 0.4 s to 4 s are allowed

    def __init__(self) -> None:
        super().__init__()
        jar = os.environ.get("FENCEKIT_ZOOKEEPER_JAR", "/usr/share/java/zookeeper.jar")
        java = shutil.which("java")
        if not Path(jar).is_file() or java is None:
            raise ServerError("--issuer zookeeper needs ZooKeeper: apt-get install zookeeper")
        extra = "/usr/share/java/slf4j-simple.jar"
        self.classpath = jar + (f":{extra}" if Path(extra).is_file() else "")
        self.java = java
        ports = _free_ports(9)
        self.client, self.quorum, self.election = ports[0::3], ports[1::3], ports[2::3]
        self.nodes = [_Node(f"zk{i + 1}", self.tmp / f"zk{i + 1}.log") for i in range(3)]

    @property
    def endpoints(self) -> str:
        return ",".join(f"{_LOOPBACK}:{p}" for p in self.client)

    def _argv(self, i: int) -> list[str]:
        data = self.tmp / f"zk{i + 1}.data"
        data.mkdir(exist_ok=True)
        (data / "myid").write_text(f"{i + 1}\n")
        conf = self.tmp / f"zk{i + 1}.cfg"
        lines = [
            f"tickTime={self.tick_ms}", "initLimit=50", "syncLimit=10", f"dataDir={data}",
            f"clientPort={self.client[i]}", f"clientPortAddress={_LOOPBACK}",
            "admin.enableServer=false", "4lw.commands.whitelist=srvr,ruok",
            "maxClientCnxns=200", "preAllocSize=4096", "electionPortBindRetry=10",
        ] + [
            f"server.{j + 1}={_LOOPBACK}:{self.quorum[j]}:{self.election[j]}" for j in range(3)
        ]  # fmt: skip
        conf.write_text("\n".join(lines) + "\n")
        return [
            self.java, "-Xmx96m", "-Xms32m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            "-Dzookeeper.jmx.log4j.disable=true", "-cp", self.classpath,
            "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(conf),
        ]  # fmt: skip

    def _mode(self, node: _Node) -> str | None:
        i = self.nodes.index(node)
        try:
            with socket.create_connection((_LOOPBACK, self.client[i]), timeout=1.0) as s:
                s.sendall(b"srvr")
                chunks = []
                while data := s.recv(4096):
                    chunks.append(data)
        except OSError:
            return None
        for line in b"".join(chunks).decode(errors="replace").splitlines():
            if line.startswith("Mode:"):
                return line.split(":", 1)[1].strip()
        return None

    def healthy(self, node: _Node) -> bool:
        return self._mode(node) in ("leader", "follower")

    def is_leader(self, node: _Node) -> bool:
        return self._mode(node) == "leader"


def start_cluster(kind: str) -> Cluster:
    cluster: Cluster = EtcdCluster() if kind == "etcd" else ZooKeeperEnsemble()
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster
