"""Fixtures for the external issuers: a real etcd cluster and ZooKeeper ensemble on loopback.

- ``etcd_cluster`` (package): three etcd members (Debian's etcd-server 3.4), started once.
- ``etcd`` (function): the same cluster, every member running and healthy again (a test that
  killed the leader may leave one restarting), plus a fresh resource name.
- ``etcd_issuer``: ``etcd_issuer(**kw) -> EtcdIssuer`` on all three members, closed after.
- ``zk_ensemble`` (package): three ZooKeeper servers (Debian's zookeeper 3.8), tick 200 ms,
  96 MB heap each; ``zk_issuer(**kw) -> ZooKeeperIssuer`` (session timeout 2 s by default).
- ``resource``: a resource name unique to the test.

Both are stopped when the tests of this package are done. A start that fails (a port taken
meanwhile) is tried once more on fresh ports. A missing server program skips these tests
outside CI and FAILS them in CI (CI=true): CI must install ``etcd-server etcd-client
zookeeper``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.lab import IN_CI
from tests.lab.issuers import (
    EtcdCluster,
    ServerBinaryMissing,
    ServerStartError,
    ZooKeeperEnsemble,
)


def _missing(exc: ServerBinaryMissing) -> None:
    if IN_CI:
        pytest.fail(f"CI must provide the issuer servers: {exc}", pytrace=False)
    pytest.skip(str(exc))


def _start_with_retry(make: Callable[[], Any]) -> Any:
    """Start a server group; once more on fresh ports if a port was taken meanwhile."""
    missing: ServerBinaryMissing | None = None
    try:
        return make().start()
    except ServerBinaryMissing as exc:
        missing = exc
    except ServerStartError:
        return make().start()
    _missing(missing)  # outside the except block: a clean fail/skip message
    raise missing


@pytest.fixture(scope="package")
def etcd_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    cluster = _start_with_retry(lambda: EtcdCluster(tmp_path_factory.mktemp("etcd"), size=3))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def etcd(etcd_cluster: EtcdCluster) -> EtcdCluster:
    for m in etcd_cluster.members:
        if not m.running:
            etcd_cluster.restart_member(m)
    etcd_cluster.wait_healthy(timeout=30)
    return etcd_cluster


@pytest.fixture
def resource() -> str:
    return f"test:{uuid.uuid4().hex[:12]}"


@pytest.fixture
def etcd_issuer(etcd: EtcdCluster) -> Iterator[Callable[..., Any]]:
    from fencekit.leases.etcd import EtcdIssuer

    made: list[EtcdIssuer] = []

    def make(**kw: Any) -> EtcdIssuer:
        kw.setdefault("request_timeout", 2.0)
        issuer = EtcdIssuer(etcd.endpoints, **kw)
        made.append(issuer)
        return issuer

    yield make
    for issuer in made:
        issuer.close()


@pytest.fixture(scope="package")
def zk_ensemble(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperEnsemble]:
    ensemble = _start_with_retry(lambda: ZooKeeperEnsemble(tmp_path_factory.mktemp("zk"), size=3))
    try:
        yield ensemble
    finally:
        ensemble.stop()


@pytest.fixture
def zk(zk_ensemble: ZooKeeperEnsemble) -> ZooKeeperEnsemble:
    for s in zk_ensemble.servers:
        if not s.running:
            zk_ensemble.restart_server(s)
    zk_ensemble.wait_healthy(timeout=60)
    return zk_ensemble


@pytest.fixture
def zk_issuer(zk: ZooKeeperEnsemble) -> Iterator[Callable[..., Any]]:
    from fencekit.leases.zookeeper import ZooKeeperIssuer

    made: list[ZooKeeperIssuer] = []

    def make(**kw: Any) -> ZooKeeperIssuer:
        kw.setdefault("session_timeout", 2.0)
        kw.setdefault("op_timeout", 5.0)
        issuer = ZooKeeperIssuer(zk.hosts, **kw)
        made.append(issuer)
        return issuer

    yield make
    for issuer in made:
        issuer.close()
