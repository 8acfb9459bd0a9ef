"""``fencekit demo --issuer etcd|zookeeper``: the paused-worker story with leases from the test
etcd cluster / ZooKeeper ensemble; a clear message and exit status 2 when no server answers."""

from __future__ import annotations

import io
import subprocess
import sys
from typing import Any

import pytest

from fencekit.demo import run_demo
from tests.lab import IN_CI
from tests.lab.ports import free_ports

pytestmark = [pytest.mark.slow, pytest.mark.multiproc]

if not IN_CI:
    pytest.importorskip("etcd3gw")
    pytest.importorskip("kazoo")


@pytest.fixture(params=["etcd", "zookeeper"])
def issuer_kind(request: pytest.FixtureRequest) -> tuple[str, str]:
    if request.param == "etcd":
        return "etcd", ",".join(request.getfixturevalue("etcd").endpoints)
    return "zookeeper", request.getfixturevalue("zk").hosts


def test_demo_with_an_external_issuer(issuer_kind: tuple[str, str], pg_dsn: str) -> None:
    kind, endpoints = issuer_kind
    out = io.StringIO()
    result = run_demo(pg_dsn, ttl=1.0, out=out, issuer=kind, issuer_endpoints=endpoints)
    text = out.getvalue()
    assert f"leases and tokens from {kind} at {endpoints}" in text
    assert f"expired by {kind}" in text
    assert result.a_token is not None
    assert result.b_token is not None
    assert result.b_token > result.a_token, text
    assert result.a_outcome == "rejected", text
    assert result.a_sqlstate == "YF001"
    assert result.final_row is not None
    assert result.final_row["computed_by"] == "B"
    assert result.ok, text


def test_demo_without_a_reachable_server_says_so(monkeypatch: Any) -> None:
    (port,) = free_ports(1)
    monkeypatch.setenv("FENCEKIT_ETCD_ENDPOINTS", f"127.0.0.1:{port}")
    proc = subprocess.run(
        [sys.executable, "-m", "fencekit.cli.demo", "--issuer", "etcd"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"no etcd server answers at 127.0.0.1:{port}" in proc.stderr
    assert "--issuer-endpoints" in proc.stderr
    assert "Traceback" not in proc.stderr
    zk_cmd = [sys.executable, "-m", "fencekit.cli.demo", "--issuer", "zookeeper"]
    proc = subprocess.run(
        [*zk_cmd, "--issuer-endpoints", f"127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"no zookeeper server answers at 127.0.0.1:{port}" in proc.stderr
