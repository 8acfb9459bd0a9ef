"""The kit's pieces against a real server: workers, checkpoints, pauses, assertions, failures.

The fixtures are the kit's own (``fenced_database``), on the suite's main server.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

import fencekit.psycopg as fkp
from fencekit.errors import StaleTokenError
from fencekit.spec import FenceSpec, TableName
from fencekit.testing import (
    FencedDatabase,
    FencingAssertionError,
    WorkerError,
    assert_fence,
    assert_no_rejections,
    assert_rejections,
    paused,
    run_many,
    takeover,
)
from pytest_fencekit import fenced_database
from tests.testing_kit.workers import (
    exit_early,
    where_is_the_database,
    write_job,
    write_job_etcd,
    write_job_zk,
)

pytestmark = pytest.mark.multiproc

JOBS = FenceSpec(TableName("public", "jobs"), scope="key", key=("id",))


def make_jobs(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE jobs (id int PRIMARY KEY, state text NOT NULL)")


jobs_db = fenced_database(schema=make_jobs, fences=[JOBS])


def test_checkpoint_costs_nothing_outside_the_kit() -> None:
    code = (
        "import sys, time\n"
        "from fencekit.testing import checkpoint\n"
        "t = time.perf_counter()\n"
        "for _ in range(200_000): checkpoint('computing')\n"
        "print((time.perf_counter() - t) / 200_000)\n"
        "print(sorted(m for m in sys.modules if m.startswith(('pytest', 'fencekit.testing.'))))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEKIT_TESTING")}
    out = subprocess.run(  # noqa: S603
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert float(out[0]) < 2e-6  # a global read and a return
    assert out[1] == "['fencekit.testing.channel']"  # nothing else of the kit, never pytest


def test_a_stale_write_is_counted_and_the_assertions_read_it(jobs_db: FencedDatabase) -> None:
    with psycopg.connect(jobs_db.app_dsn, autocommit=True) as conn:
        with fkp.transaction(conn, 7):
            conn.execute("INSERT INTO jobs VALUES (1, 'a')")
        with pytest.raises(StaleTokenError), fkp.transaction(conn, 6):
            conn.execute("UPDATE jobs SET state = 'b' WHERE id = 1")
    assert assert_rejections("jobs", stale=1, missing=0)["stale"] == 1
    assert_fence("public.jobs", at_least=7)
    with pytest.raises(FencingAssertionError) as failed:
        assert_rejections("public.jobs", stale=2)
    message = str(failed.value)
    assert "rejections on public.jobs: stale: expected 2, counted 1" in message
    assert "public.jobs: key fence on (id), resource public.jobs, highest token accepted 7" in (
        message
    )
    with pytest.raises(FencingAssertionError, match=r"public\.nothing is not protected"):
        assert_rejections("public.nothing", stale=0)
    with pytest.raises(FencingAssertionError, match="stale: expected 0, counted 1"):
        assert_no_rejections("jobs")


def test_takeover_passes_on_a_fenced_table(jobs_db: FencedDatabase) -> None:
    result = takeover(write_job, jobs_db.app_dsn, 3, resource="jobs:3", table="jobs")
    assert result.a_outcome.rejected == "stale"
    assert result.b_token is not None
    assert result.a_token is not None
    assert result.b_token > result.a_token
    assert result.fence_after_b == result.b_token
    assert result.rows_after_a == result.rows_after_b
    assert result.a.rejections[0]["token"] == result.a_token
    assert result.a.rejections[0]["fence"] == result.b_token


def test_takeover_names_the_grant_to_first_write_gap(jobs_db: FencedDatabase) -> None:
    # B takes the lease over and writes nothing: the fence never sees B's token, so A's token
    # is not stale yet and A's write lands. The kit must say that, not just "lost update".
    with pytest.raises(FencingAssertionError) as failed:
        takeover(write_job, jobs_db.app_dsn, 4, only="A", resource="jobs:4", table="jobs")
    message = str(failed.value)
    assert "LOST UPDATE: worker A resumed after its lease on 'jobs:4' had expired" in message
    assert "why: the grant-to-first-write gap: when A resumed, public.jobs's fence was None" in (
        message
    )
    assert "Claim at grant" in message


def test_paused_resumes_the_worker_when_the_block_fails(jobs_db: FencedDatabase) -> None:
    a = jobs_db.spawn(write_job, jobs_db.app_dsn, 5, pause_at="computing")
    a.wait_for("computing")
    assert a.held_at == "computing"
    seen = []

    def fail_while_paused() -> None:
        with paused(a):
            seen.append(_state(a.pid))
            raise RuntimeError("the test's own failure")

    with pytest.raises(RuntimeError, match="the test's own failure"):
        fail_while_paused()
    assert seen == ["T"]  # it was stopped inside the block
    assert _state(a.pid) != "T"
    assert a.join().ok


def test_run_many_pauses_at_the_checkpoint_until_a_newer_write(jobs_db: FencedDatabase) -> None:
    # Each pause holds a worker at "computing" until another worker has written under a newer
    # token: its own write then goes stale, and the fence rejects it.
    result = run_many(write_job, jobs_db.app_dsn, 10, copies=3, seconds=4, ttl=1.0, kills=False)
    pauses = [e for e in result.events if e["type"] == "pause"]
    assert pauses
    assert {e["at"] for e in pauses} == {"computing"}
    # Each pause's write was rejected (more stale writes: a worker the machine starved).
    assert result.rejections["public.jobs"]["stale"] >= len(pauses), result.summary()
    # A passing run leaves no files behind in the temporary directory it made.
    assert result.workdir is None


def test_run_many_keeps_its_files_in_a_given_workdir(
    jobs_db: FencedDatabase, tmp_path: Path
) -> None:
    result = run_many(
        write_job, jobs_db.app_dsn, 12, copies=2, seconds=3, ttl=1.0, kills=False, workdir=tmp_path
    )
    assert result.workdir == tmp_path
    # The run's files stay where it was told to put them (the history, the workers' output).
    assert (tmp_path / "nemesis.jsonl").exists()
    assert {"w1.log", "w2.log"} <= {p.name for p in tmp_path.glob("*.log")}


def test_run_many_says_when_no_worker_reached_the_checkpoint(jobs_db: FencedDatabase) -> None:
    with pytest.raises(WorkerError, match="reached checkpoint 'elsewhere' in 2s, so none was") as e:
        run_many(write_job, jobs_db.app_dsn, 11, copies=2, seconds=2, kills=False, at="elsewhere")
    # A failing run keeps its files, and says where.
    kept = Path(str(e.value).rsplit("files: ", 1)[1].strip())
    assert (kept / "nemesis.jsonl").exists()
    shutil.rmtree(kept)


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_paused_waits_on_the_servers_clock(jobs_db: FencedDatabase) -> None:
    a = jobs_db.spawn(write_job, jobs_db.app_dsn, 6, pause_at="computing", ttl=1.0)
    a.wait_for("computing")
    with paused(a, until_lease_expired="jobs:6"):
        lease = jobs_db.lease("jobs:6")
        assert lease is not None
        assert lease["expires_in"] is not None
        assert lease["expires_in"] <= 0  # expired by the server's clock when the block runs
    assert a.join().ok  # nobody took over: its write is still the newest


def test_a_worker_that_ends_early_is_reported_with_its_output(jobs_db: FencedDatabase) -> None:
    w = jobs_db.spawn(exit_early)
    with pytest.raises(WorkerError) as failed:
        w.wait_for("computing")
    assert "ended (exited 3) before checkpoint 'computing'" in str(failed.value)
    assert "| giving up before any checkpoint" in str(failed.value)


def test_a_worker_gets_its_databases_dsn_and_its_framework_setup(
    jobs_db: FencedDatabase,
) -> None:
    assert jobs_db.spawn(where_is_the_database).join().value == jobs_db.app_dsn
    setup = "tests.testing_kit.workers:broken_setup"
    outcome = jobs_db.spawn(where_is_the_database, env={"FENCEKIT_TESTING_SETUP": setup}).join()
    assert not outcome.ok
    assert outcome.error is not None
    assert outcome.error["message"] == "the framework setup failed"  # before the code loads


def test_command_workers_and_held_checkpoints(jobs_db: FencedDatabase) -> None:
    code = "from fencekit.testing import checkpoint\ncheckpoint('a')\nprint('after a')\n"
    w = jobs_db.spawn_command([sys.executable, "-c", code], pause_at="a")
    w.wait_for("a")
    assert w.held_at == "a"
    assert "after a" not in w.output
    outcome = w.join()
    assert outcome.ok
    assert outcome.exitcode == 0
    assert "after a" in w.output


def test_a_worker_that_cannot_be_spawned_is_explained(jobs_db: FencedDatabase) -> None:
    with pytest.raises(TypeError, match="module-level function of an importable module"):
        jobs_db.spawn(lambda: None)


@pytest.mark.system
def test_takeover_waits_on_the_etcd_leaders_clock(jobs_db: FencedDatabase, tmp_path: Path) -> None:
    from fencekit.leases.etcd import EtcdIssuer
    from tests.lab.issuers import EtcdCluster, ServerBinaryMissing

    try:
        cluster = EtcdCluster(tmp_path / "etcd", size=1).start()
    except ServerBinaryMissing as exc:
        pytest.skip(str(exc))
    try:
        with EtcdIssuer(cluster.endpoints, request_timeout=2.0) as issuer:
            result = takeover(
                write_job_etcd, jobs_db.app_dsn, cluster.endpoints, 8,
                resource="jobs:8", table="jobs", issuer=issuer,
            )  # fmt: skip
        assert result.a_outcome.rejected == "stale"
        assert result.a.rejections[0]["fence"] > result.a.rejections[0]["token"]
    finally:
        cluster.stop()


@pytest.mark.system
def test_takeover_waits_on_the_zookeeper_leaders_clock(
    jobs_db: FencedDatabase, tmp_path: Path
) -> None:
    pytest.importorskip("kazoo", reason="the zookeeper extra: pip install 'pg-fencekit[zookeeper]'")
    from fencekit.leases.zookeeper import ZooKeeperIssuer
    from tests.lab.issuers import ServerBinaryMissing, ZooKeeperEnsemble

    try:
        ensemble = ZooKeeperEnsemble(tmp_path / "zk", size=1).start()
    except ServerBinaryMissing as exc:
        pytest.skip(str(exc))
    try:
        with ZooKeeperIssuer(ensemble.hosts, session_timeout=2.0) as issuer:
            result = takeover(
                write_job_zk, jobs_db.app_dsn, ensemble.hosts, 9,
                resource="jobs:9", table="jobs", issuer=issuer,
            )  # fmt: skip
        assert result.a_outcome.rejected == "stale"
        assert result.a.rejections[0]["fence"] > result.a.rejections[0]["token"]
    finally:
        ensemble.stop()


def _ledger() -> Any:
    from sqlalchemy import Column, Integer, MetaData, Table, Text

    from fencekit.declare import declare_fence

    metadata = MetaData()
    ledger = Table(
        "ledger", metadata,
        Column("account_id", Integer, primary_key=True), Column("note", Text),
    )  # fmt: skip
    declare_fence(ledger, scope="key", key=["account_id"])
    return metadata


LEDGER = _ledger()


def make_ledger(dsn: str) -> None:
    from sqlalchemy import create_engine

    engine = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(dsn))
    LEDGER.create_all(engine)
    engine.dispose()


ledger_db = fenced_database(schema=make_ledger, fences=LEDGER, history=False, scope="session")


def test_fences_declared_on_a_metadata_are_protected(ledger_db: FencedDatabase) -> None:
    spec = ledger_db.spec_of("ledger")
    assert spec is not None
    assert spec.key == ("account_id",)
    with psycopg.connect(ledger_db.app_dsn, autocommit=True) as conn:
        with pytest.raises(Exception, match="token"):
            conn.execute("INSERT INTO ledger VALUES (1, 'no token')")
        with fkp.transaction(conn, 3):
            conn.execute("INSERT INTO ledger VALUES (1, 'fenced')")
    assert_rejections("ledger", db=ledger_db, missing=1)
    with pytest.raises(Exception, match="history=False"):
        ledger_db.history_events()
