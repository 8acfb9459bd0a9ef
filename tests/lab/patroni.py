"""A two-node PostgreSQL cluster under Patroni, with etcd as its store, on loopback.

Built from what Debian ships (PostgreSQL's binaries in ``/usr/lib/postgresql/<v>/bin``, etcd
3.4) and Patroni from the package index in a virtualenv of Debian's own Python
(``scripts/_patroni.sh`` makes it; :func:`patroni_binary` finds it). Everything runs as child
processes of the caller, on free ports of 127.0.0.1, in one temporary directory that
:meth:`PatroniCluster.stop` removes.

Why these choices (measured on the 2-core CI machine, Patroni 4.1.5):

- Patroni and PostgreSQL run as the ``postgres`` OS user (PostgreSQL refuses root), so
  Patroni's Python must be readable by that user: a virtualenv of ``/usr/bin/python3``, not of
  an interpreter in root's home.
- Patroni raises a ``ttl`` below 20 s to 20 s, so a primary that dies silently is replaced after
  about 20 s. :meth:`PatroniCluster.kill_primary` does what a fencing-aware operator (or a
  STONITH agent) does: it kills the primary's Patroni *and* its postmaster (the postmaster is
  not Patroni's child) and deletes the leader key in etcd, and the standby's Patroni promotes it
  within its next loop (``loop_wait`` 1 s): a failover in about a second.
- The killed node rejoins as a standby with ``pg_rewind`` (``wal_log_hints``) when its Patroni
  is started again (:meth:`PatroniCluster.rejoin`).

Asynchronous or synchronous replication is a Patroni setting of the running cluster
(:meth:`PatroniCluster.set_synchronous`): ``synchronous_mode`` makes the standby synchronous,
so every acknowledged commit is on it before the client hears of it.

Usable outside pytest::

    with PatroniCluster.start_new() as cluster:
        print(cluster.dsn)       # multi-host, target_session_attrs=read-write
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psycopg

from tests.lab.ports import LOOPBACK, free_ports

__all__ = [
    "PATRONI_VERSION",
    "ClusterError",
    "PatroniCluster",
    "PatroniNode",
    "patroni_binary",
]

PATRONI_VERSION = "4.1.5"
_OS_USER = "postgres"


class ClusterError(RuntimeError):
    """The cluster did not reach the state asked for in time (the message carries logs)."""


def _repo_root() -> Path:
    # The lab lives in a checkout (tests/lab/), never in the wheel: the root is two levels up.
    return Path(__file__).resolve().parents[2]


def patroni_binary() -> Path:
    """The ``patroni`` program of the virtualenv ``scripts/_patroni.sh`` builds.

    ``FENCEKIT_PATRONI`` overrides it. Raises :class:`ClusterError` saying how to build it.
    """
    env = os.environ.get("FENCEKIT_PATRONI")
    path = (
        Path(env)
        if env
        else _repo_root() / ".cache" / "patroni" / f"venv-{PATRONI_VERSION}" / "bin" / "patroni"
    )
    if not path.is_file():
        raise ClusterError(
            f"Patroni not found at {path}: build its virtualenv with "
            "`bash -c 'source scripts/_patroni.sh && ensure_patroni'` (./scripts/test does it), "
            "or set FENCEKIT_PATRONI to a patroni program the postgres OS user can run"
        )
    return path


def _as_postgres() -> dict[str, Any]:
    """Popen arguments that run a child as the postgres OS user when we are root."""
    if os.geteuid() != 0:
        return {}
    pw = pwd.getpwnam(_OS_USER)
    return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}


def _chown(path: Path) -> None:
    if os.geteuid() != 0:
        return
    pw = pwd.getpwnam(_OS_USER)
    os.chown(path, pw.pw_uid, pw.pw_gid)


def _http(url: str, body: dict[str, Any] | None = None, method: str | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method or ("POST" if data else "GET"))
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=2) as resp:  # noqa: S310 - loopback only
        raw = resp.read()
    return json.loads(raw) if raw else None


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


def _query(dsn: str, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]] | None:
    """The rows of one autocommit query, or None when the server does not answer."""
    try:
        with psycopg.connect(dsn, connect_timeout=2, autocommit=True) as conn:
            return list(conn.execute(query, params).fetchall())
    except psycopg.Error:
        return None


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc)."""
    out: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid:
            out.append(int(entry.name))
    return out


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _gone(pid: int) -> bool:
    """True once ``pid`` no longer runs (absent, or a zombie waiting to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _wait_gone(pids: list[int], timeout: float = 10.0) -> None:
    """A SIGKILL takes effect over an interval, not at once: a backend the kernel has not yet
    torn down can still acknowledge a commit. Wait until every process is really gone."""
    deadline = time.monotonic() + timeout
    while not all(_gone(p) for p in pids):
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes still running {timeout:g}s after SIGKILL: {pids}")
        time.sleep(0.005)


@dataclass
class PatroniNode:
    """One PostgreSQL node and its Patroni."""

    name: str
    pg_port: int
    api_port: int
    base: Path
    proc: subprocess.Popen[bytes] | None = None
    log_file: IO[bytes] | None = field(default=None, repr=False)

    @property
    def data_dir(self) -> Path:
        return self.base / "data"

    @property
    def config(self) -> Path:
        return self.base / "patroni.yml"

    @property
    def log_path(self) -> Path:
        return self.base / "patroni.log"

    @property
    def api(self) -> str:
        return f"http://{LOOPBACK}:{self.api_port}"

    @property
    def dsn(self) -> str:
        return f"host={LOOPBACK} port={self.pg_port} user=postgres dbname=postgres"

    def dsn_for(self, dbname: str) -> str:
        return f"host={LOOPBACK} port={self.pg_port} user=postgres dbname={dbname}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def status(self) -> dict[str, Any]:
        """Patroni's view of this node (GET /patroni), or {} when it does not answer."""
        try:
            got = _http(self.api + "/patroni")
        except (OSError, ValueError, urllib.error.URLError):
            return {}
        return got if isinstance(got, dict) else {}

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data_dir / "postmaster.pid").read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return None


class PatroniCluster:
    """etcd (one member) and two PostgreSQL nodes under Patroni, on loopback."""

    def __init__(
        self,
        base_dir: Path,
        *,
        pg_version: int = 15,
        patroni: Path | None = None,
        scope: str | None = None,
    ) -> None:
        self.base = base_dir
        self.bindir = Path(f"/usr/lib/postgresql/{pg_version}/bin")
        if not (self.bindir / "pg_ctl").exists():
            raise ClusterError(
                f"Debian PostgreSQL {pg_version} is not installed ({self.bindir}/pg_ctl): "
                f"apt-get install postgresql-{pg_version}"
            )
        self.etcd_bin = shutil.which(os.environ.get("FENCEKIT_ETCD_BIN") or "etcd")
        if not self.etcd_bin:
            raise ClusterError("etcd not found: apt-get install etcd-server etcd-client")
        self.patroni = patroni or patroni_binary()
        self.scope = scope or f"fk{uuid.uuid4().hex[:8]}"
        ports = free_ports(6)
        self.etcd_port, self.etcd_peer = ports[0], ports[1]
        self.nodes = [
            PatroniNode(f"node{i}", ports[2 + 2 * i], ports[3 + 2 * i], base_dir / f"node{i}")
            for i in range(2)
        ]
        self.etcd_proc: subprocess.Popen[bytes] | None = None
        self._etcd_log: IO[bytes] | None = None
        #: one line per event (start, kill, promotion, rejoin) with its time, for reports.
        self.events: list[str] = []
        self._t0 = time.monotonic()

    # ------------------------------------------------------------------ life cycle

    @classmethod
    def start_new(cls, **kwargs: Any) -> PatroniCluster:
        base = Path(tempfile.mkdtemp(prefix="fencekit-ha-"))
        os.chmod(base, 0o755)
        cluster = cls(base, **kwargs)
        try:
            cluster.start()
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def note(self, what: str) -> None:
        self.events.append(f"{time.monotonic() - self._t0:7.2f}s {what}")

    def start(self, timeout: float = 90.0) -> None:
        self._start_etcd()
        for node in self.nodes:
            node.base.mkdir(parents=True, exist_ok=True)
            os.chmod(node.base, 0o700)
            _chown(node.base)
            node.config.write_text(self._config(node))
            _chown(node.config)
        # The first node bootstraps; the second clones it once it leads.
        self._launch(self.nodes[0])
        self.wait_primary(self.nodes[0], timeout)
        self._launch(self.nodes[1])
        self.wait_streaming(self.nodes[1], timeout)
        self.note(f"cluster up: primary {self.nodes[0].name}, standby {self.nodes[1].name}")

    def stop(self) -> None:
        for node in self.nodes:
            self._stop_node(node)
        if self.etcd_proc is not None and self.etcd_proc.poll() is None:
            self.etcd_proc.terminate()
            try:
                self.etcd_proc.wait(10)
            except subprocess.TimeoutExpired:
                self.etcd_proc.kill()
                self.etcd_proc.wait(10)
        if self._etcd_log is not None:
            self._etcd_log.close()
            self._etcd_log = None
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> PatroniCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _start_etcd(self) -> None:
        data = self.base / "etcd.data"
        url = f"http://{LOOPBACK}:{self.etcd_port}"
        peer = f"http://{LOOPBACK}:{self.etcd_peer}"
        self._etcd_log = open(self.base / "etcd.log", "ab")  # noqa: SIM115 - closed in stop
        assert self.etcd_bin is not None
        self.etcd_proc = subprocess.Popen(  # noqa: S603 - fixed argv
            [
                self.etcd_bin,
                "--name=etcd0",
                f"--data-dir={data}",
                f"--listen-client-urls={url}",
                f"--advertise-client-urls={url}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=etcd0={peer}",
                "--initial-cluster-state=new",
                "--heartbeat-interval=100",
                "--election-timeout=1000",
                "--logger=zap",
                "--log-outputs=stderr",
            ],
            stdout=self._etcd_log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError, urllib.error.URLError):
                if _http(url + "/health").get("health") in (True, "true"):
                    return
            if self.etcd_proc.poll() is not None:
                break
            time.sleep(0.1)
        raise ClusterError(f"etcd did not start:\n{_tail(self.base / 'etcd.log')}")

    def _config(self, node: PatroniNode) -> str:
        # JSON is YAML: Patroni reads this file as YAML.
        conf = {
            "scope": self.scope,
            "namespace": "/fencekit/",
            "name": node.name,
            "log": {"level": "INFO"},
            "restapi": {
                "listen": f"{LOOPBACK}:{node.api_port}",
                "connect_address": f"{LOOPBACK}:{node.api_port}",
            },
            "etcd3": {"hosts": f"{LOOPBACK}:{self.etcd_port}"},
            "bootstrap": {
                "dcs": {
                    "ttl": 20,
                    "loop_wait": 1,
                    "retry_timeout": 5,
                    # An asynchronous standby behind by less than this may be promoted: the
                    # point of the async runs is to lose what it did not receive.
                    "maximum_lag_on_failover": 1024 * 1024 * 1024,
                    "synchronous_mode": False,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": {
                            "wal_log_hints": "on",
                            "max_wal_senders": 5,
                            "max_replication_slots": 5,
                            "wal_keep_size": "128MB",
                            "max_connections": 100,
                            "hot_standby": "on",
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"locale": "C"}],
            },
            "postgresql": {
                "listen": f"{LOOPBACK}:{node.pg_port}",
                "connect_address": f"{LOOPBACK}:{node.pg_port}",
                "data_dir": str(node.data_dir),
                "bin_dir": str(self.bindir),
                "pgpass": str(node.base / "pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres", "password": "postgres"},
                    "replication": {"username": "replicator", "password": "replicator"},
                    "rewind": {"username": "postgres", "password": "postgres"},
                },
                # trust on loopback only: nothing else listens.
                "pg_hba": [
                    "local all all trust",
                    f"host all all {LOOPBACK}/32 trust",
                    f"host replication all {LOOPBACK}/32 trust",
                ],
                "parameters": {
                    "unix_socket_directories": str(node.base),
                    "listen_addresses": LOOPBACK,
                    "logging_collector": "off",
                },
            },
        }
        return json.dumps(conf, indent=1)

    def _launch(self, node: PatroniNode) -> None:
        node.log_file = open(node.log_path, "ab")  # noqa: SIM115 - closed in _stop_node
        node.proc = subprocess.Popen(  # noqa: S603 - fixed argv
            [str(self.patroni), str(node.config)],
            stdout=node.log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=str(node.base),
            start_new_session=True,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(node.base)},
            **_as_postgres(),
        )

    def _stop_node(self, node: PatroniNode) -> None:
        # Throwaway data: SIGKILL everything rather than wait for a clean shutdown (~5 s).
        if node.running:
            assert node.proc is not None
            node.proc.kill()
            node.proc.wait(10)
        pid = node.postmaster_pid()
        if pid is not None and Path(f"/proc/{pid}").exists():
            for child in _children(pid):
                _kill(child)
            _kill(pid)
        if node.log_file is not None:
            node.log_file.close()
            node.log_file = None

    # ------------------------------------------------------------------ state

    def _fail(self, what: str) -> ClusterError:
        logs = "\n".join(
            f"--- {n.name} {n.status() or '(no answer)'}\n{_tail(n.log_path)}" for n in self.nodes
        )
        return ClusterError(f"patroni cluster: {what}\n{logs}")

    def primary(self) -> PatroniNode:
        """The node that is a running primary now (raises when none or two)."""
        leaders = [
            n
            for n in self.nodes
            if n.running
            and n.status().get("role") in ("primary", "master")
            and n.status().get("state") == "running"
        ]
        if len(leaders) != 1:
            raise self._fail(f"expected one primary, found {[n.name for n in leaders]}")
        return leaders[0]

    def standby(self) -> PatroniNode:
        primary = self.primary()
        return next(n for n in self.nodes if n is not primary)

    def wait_primary(self, node: PatroniNode, timeout: float = 60.0) -> float:
        """Wait until ``node`` is a running primary accepting writes; seconds waited."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            st = node.status()
            leads = st.get("role") in ("primary", "master") and st.get("state") == "running"
            if leads and _query(node.dsn, "SELECT pg_is_in_recovery()") == [(False,)]:
                return time.monotonic() - t0
            if not node.running:
                raise self._fail(f"{node.name}'s Patroni exited")
            time.sleep(0.1)
        raise self._fail(f"{node.name} not primary after {timeout:.0f}s")

    def wait_streaming(self, node: PatroniNode, timeout: float = 60.0) -> float:
        """Wait until ``node`` is a standby streaming from the primary; seconds waited."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            st = node.status()
            if (
                st.get("role") == "replica"
                and st.get("state") in ("running", "streaming")
                and st.get("replication_state", "streaming") == "streaming"
            ) and _query(node.dsn, "SELECT status FROM pg_stat_wal_receiver") == [("streaming",)]:
                return time.monotonic() - t0
            if not node.running:
                raise self._fail(f"{node.name}'s Patroni exited")
            time.sleep(0.2)
        raise self._fail(f"{node.name} not streaming after {timeout:.0f}s")

    def wait_caught_up(self, timeout: float = 30.0) -> None:
        """Wait until the standby replayed everything the primary has written."""
        primary, standby = self.primary(), self.standby()
        with psycopg.connect(primary.dsn, autocommit=True) as conn:
            row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
            assert row is not None
            target = row[0]
        deadline = time.monotonic() + timeout
        with psycopg.connect(standby.dsn, autocommit=True) as conn:
            while time.monotonic() < deadline:
                row = conn.execute(
                    "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)
                ).fetchone()
                if row is not None and row[0]:
                    return
                time.sleep(0.05)
        raise self._fail(f"standby did not replay up to {target} in {timeout:.0f}s")

    @property
    def dsn(self) -> str:
        """Both nodes, the writable one chosen at connect time (libpq multi-host)."""
        return self.dsn_for("postgres")

    def dsn_for(self, dbname: str) -> str:
        hosts = ",".join(LOOPBACK for _ in self.nodes)
        ports = ",".join(str(n.pg_port) for n in self.nodes)
        return (
            f"host={hosts} port={ports} user=postgres dbname={dbname} "
            "target_session_attrs=read-write connect_timeout=2"
        )

    # ------------------------------------------------------------------ faults

    @contextlib.contextmanager
    def replication_paused(self) -> Iterator[None]:
        """Stop the primary's WAL sender (SIGSTOP) for the block: commits made meanwhile are
        on the primary only, as on an asynchronous standby that lags. SIGCONT after, unless
        the primary was killed meanwhile."""
        primary = self.primary()
        with psycopg.connect(primary.dsn, autocommit=True) as conn:
            pids = [int(r[0]) for r in conn.execute("SELECT pid FROM pg_stat_replication")]
        if not pids:
            raise self._fail("no WAL sender to pause")
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        self.note(f"replication from {primary.name} paused (wal sender SIGSTOP)")
        try:
            yield
        finally:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    def kill_primary(self, *, release_leader_key: bool = True) -> PatroniNode:
        """SIGKILL the primary's Patroni, its postmaster and every PostgreSQL process of it,
        then (by default) delete the leader key so the standby promotes at once. Returns the
        killed node; :meth:`rejoin` brings it back as a standby."""
        node = self.primary()
        assert node.proc is not None
        pid = node.postmaster_pid()
        # Freeze the postmaster first: a stopped postmaster forks no new backend, so the
        # children listed next are all of them (a backend forked after the listing would
        # outlive the kill and could acknowledge a commit after it).
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        kids = _children(pid) if pid is not None else []
        for child in kids:
            _kill(child)
        if pid is not None:
            _kill(pid)
        _kill(node.proc.pid)
        node.proc.wait(10)
        # Return only when the kill has taken effect: callers take "now" as the moment after
        # which the old primary acknowledges nothing (fencekit.chaos.ha's loss window).
        _wait_gone([*kids, *([pid] if pid is not None else [])])
        if node.log_file is not None:
            node.log_file.close()
            node.log_file = None
        self.note(f"primary {node.name} killed (patroni + postmaster SIGKILL)")
        if release_leader_key:
            key = f"/fencekit/{self.scope}/leader".encode()
            _http(
                f"http://{LOOPBACK}:{self.etcd_port}/v3/kv/deleterange",
                {"key": base64.b64encode(key).decode()},
            )
            self.note("leader key deleted in etcd")
        return node

    def failover(self) -> tuple[PatroniNode, PatroniNode, float]:
        """Kill the primary and wait for the standby to lead: (killed, new primary, seconds)."""
        t0 = time.monotonic()
        new = self.standby()
        old = self.kill_primary()
        self.wait_primary(new)
        took = time.monotonic() - t0
        self.note(f"{new.name} promoted, writable after {took:.2f}s")
        return old, new, took

    def rejoin(self, node: PatroniNode, timeout: float = 90.0) -> float:
        """Start a killed node's Patroni again; it rewinds and follows as a standby."""
        t0 = time.monotonic()
        self._launch(node)
        self.wait_streaming(node, timeout)
        took = time.monotonic() - t0
        self.note(f"{node.name} rejoined as standby after {took:.2f}s")
        return took

    def set_synchronous(self, on: bool, timeout: float = 60.0) -> None:
        """Patroni's ``synchronous_mode`` (cluster-wide, through its REST API) and wait for it:
        on means the standby is listed as synchronous on the primary."""
        primary = self.primary()
        _http(primary.api + "/config", {"synchronous_mode": on}, method="PATCH")
        want = "sync" if on else "async"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = _query(primary.dsn, "SELECT sync_state FROM pg_stat_replication")
            # Patroni records the synchronous standby in etcd (the /sync key) one loop after
            # PostgreSQL reports it; only a node named there may be promoted in sync mode.
            if rows and all(r[0] == want for r in rows) and self._sync_recorded(on):
                self.note(f"replication {want}hronous")
                return
            time.sleep(0.2)
        raise self._fail(f"replication did not become {want} in {timeout:.0f}s")

    def _sync_recorded(self, on: bool) -> bool:
        try:
            members = _http(self.primary().api + "/cluster").get("members", [])
        except (OSError, ValueError, urllib.error.URLError):
            return False
        sync = [m for m in members if m.get("role") in ("sync_standby", "quorum_standby")]
        return bool(sync) if on else not sync

    def timeline(self, node: PatroniNode | None = None) -> int:
        """The live timeline of a node's WAL (from the current WAL file's name)."""
        node = node or self.primary()
        with psycopg.connect(node.dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8))"
                "::bit(32)::int"
            ).fetchone()
        assert row is not None
        return int(row[0])
