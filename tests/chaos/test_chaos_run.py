"""Short chaos runs: the lab's (a PostgreSQL 15 the run starts, crashes and restarts itself,
pgbouncer, faked clocks, etcd and ZooKeeper clusters) with every fault (no violation), and
fencekit's own on a given server: unfenced (lost updates found), lease-bound, and with a
deliberately broken issuer (must fail).

The long runs are commands in docs/chaos.md, not tests.

A run must also prove something: faults happened and writes went through them. How much a
few seconds hold depends on the machine's load, so a run that exercised too little is not a
failure but inconclusive: it runs again, longer (:func:`_until_exercised`). Every run's
safety verdict is asserted, inconclusive or not.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import psycopg
import pytest

from fencekit.chaos import ChaosConfig, ChaosResult, run_chaos
from fencekit.cli import main
from tests.lab import IN_CI
from tests.lab.__main__ import main as lab_main
from tests.lab.chaos import LabEnvironment, LabOptions, find_bindir
from tests.lab.clocks import find_libfaketime
from tests.lab.pgbouncer import pgbouncer_binary

pytestmark = [pytest.mark.slow, pytest.mark.multiproc, pytest.mark.system]

T = TypeVar("T")

#: Each inconclusive run is followed by a longer one, at most this many times in all.
LONGER = (1, 2, 4)


def _until_exercised(
    run: Callable[[float], T], short_of: Callable[[T], list[str]], seconds: float
) -> T:
    """``run(duration)`` (which asserts the run's safety verdict itself) until
    ``short_of(result)`` names no activity threshold the run fell short of."""
    shortfalls: list[str] = []
    for factor in LONGER:
        result = run(seconds * factor)
        shortfalls = short_of(result)
        if not shortfalls:
            return result
        print(f"inconclusive {seconds * factor:g}s run ({'; '.join(shortfalls)}): longer")
    pytest.fail(
        f"{len(LONGER)} runs up to {seconds * LONGER[-1]:g}s exercised too little: "
        f"{'; '.join(shortfalls)}"
    )


def _short_of(values: dict[str, int], minimum: dict[str, int]) -> list[str]:
    return [f"{k} {values[k]} < {n}" for k, n in minimum.items() if values[k] < n]


@pytest.fixture(autouse=True)
def _needs_servers() -> None:
    missing = []
    if find_bindir() is None:
        missing.append("PostgreSQL binaries (apt-get install postgresql-15)")
    if pgbouncer_binary() is None:
        missing.append("pgbouncer (apt-get install pgbouncer)")
    if find_libfaketime() is None:
        missing.append("libfaketime (apt-get install faketime)")
    if missing:
        reason = "chaos runs need " + " and ".join(missing)
        if IN_CI:
            pytest.fail(reason)
        pytest.skip(reason)


def test_fenced_run_with_every_fault_has_no_violation(capsys, tmp_path: Path) -> None:
    """Pauses, kills, a crash, pgbouncer paused with commits in flight, and the workers' and
    the server's clocks stepped, skewed and frozen: the fence holds."""
    history, html = tmp_path / "history.jsonl", tmp_path / "run.html"

    def run(seconds: float) -> dict:
        argv = ["chaos", "--duration", f"{seconds:g}", "--seed", "7", "--net-faults",
                "--clock-faults", "--json", "--history", str(history), "--report",
                str(html)]  # fmt: skip
        code = lab_main(argv)
        captured = capsys.readouterr()
        out = captured.out
        assert out.strip(), f"exit {code}, no report; stderr:\n{captured.err[-4000:]}"
        summary = json.loads(out.strip().splitlines()[-1])
        assert code == 0, out
        assert summary["violations"] == 0, out
        assert summary["stale_accepted"] == 0, out
        assert "what depends on clocks" in out
        return summary

    # The run proved something: faults happened and writes went through them.
    minimum = {"acknowledged": 11, "pauses": 3, "kills": 1, "crashes": 1, "bouncer_restarts": 1,
               "net_faults": 1, "clock_faults": 1, "handovers": 3}  # fmt: skip
    summary = _until_exercised(run, lambda r: _short_of(r, minimum), 12)
    events = [json.loads(line) for line in history.read_text().splitlines()]
    kinds = {e["type"] for e in events}
    assert kinds >= {"run", "acquire", "renew", "invoke", "ok", "crash", "net", "clock"}, kinds
    assert kinds >= {"committed", "register"}, kinds  # the final state: checkable alone
    assert {e["target"] for e in events if e["type"] == "clock"} == {"workers", "server"}
    # Through pgbouncer too, the workers were the run's application role, not a superuser.
    _assert_workers_were_the_app_role(events, summary["worker_role"])
    # The saved history checks the same way again, from the file alone.
    assert main(["chaos", "check", str(history), "--json"]) == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {k: again[k] for k in ("writes", "grants", "violations", "unknown")} == {
        k: summary[k] for k in ("writes", "grants", "violations", "unknown")
    }
    text = html.read_text()
    assert "<script src=" not in text  # one self-contained file
    assert "lease: w0" in text
    assert "fault: net" in text


def _assert_workers_were_the_app_role(events: list[dict], role: str) -> None:
    """Every worker recorded its session: the run's role, no superuser, fencekit_writer only."""
    assert role.startswith("fencekit_chaos_worker_"), role
    workers = {e["p"] for e in events if e["type"] == "invoke"}
    sessions = {e["p"]: e for e in events if e["type"] == "session"}
    assert workers, "no worker wrote anything"
    assert workers <= set(sessions), f"workers without a session event: {workers - set(sessions)}"
    for e in sessions.values():
        assert e["user"] == role, e
        assert e["superuser"] is False, e
        assert e["createrole"] is False, e
        assert e["createdb"] is False, e
        assert e["member_of"] == ["fencekit_writer"], e


def test_unfenced_run_finds_lost_updates(pg_dsn: str) -> None:
    def run(seconds: float) -> tuple[ChaosResult, str]:
        out = io.StringIO()
        result = run_chaos(
            ChaosConfig(duration=seconds, seed=7, fence=False, dsn=pg_dsn), out=out,
            progress=print,
        )  # fmt: skip
        report = result.report
        # Without the fence, whatever the run found is a lost update of one kind or another.
        assert report.lost_updates == report.count("lost update") + report.count(
            "stale write accepted"
        )
        return result, out.getvalue()

    # A short run may find only an unfenced write accepted ("ok" without the fence, but no
    # stale write went through): inconclusive, like one that found nothing.
    def short_of(r: tuple[ChaosResult, str]) -> list[str]:
        return [] if r[0].report.count("stale write accepted") else ["no stale write accepted"]

    result, out = _until_exercised(run, short_of, 6)
    assert result.ok, out  # without the fence: the checker found what fencing would stop
    assert result.report.lost_updates > 0, out
    assert "stale write accepted" in out


def test_broken_issuer_fails_the_run(pg_dsn: str) -> None:
    """An issuer that grants a held lease and hands back the live holder's token: with the
    fence on and in key scope (equal tokens pass a key fence), the checker must fail it."""

    def run(seconds: float) -> tuple[ChaosResult, str]:
        out = io.StringIO()
        result = run_chaos(
            ChaosConfig(
                duration=seconds, seed=4, workers=4, resources=2, dsn=pg_dsn,
                issuer_factory="tests.chaos.broken_issuer:make",
            ),
            out=out, progress=print,
        )  # fmt: skip
        return result, out.getvalue()

    def short_of(r: tuple[ChaosResult, str]) -> list[str]:
        kinds = set(r[0].report.by_kind)
        need = [{"duplicate token", "reused token"}, {"lease overlap"}]
        return [" or ".join(sorted(k)) + " not found" for k in need if not kinds & k]

    result, out = _until_exercised(run, short_of, 5)
    assert result.report.violations, out
    assert result.ok, out  # "ok" for a broken issuer: it was caught
    assert "As expected with a broken issuer" in out


def test_lease_bound_run_on_your_server_has_no_lost_update(pg_dsn: str, tmp_path) -> None:
    """--dsn: the run creates its workers' role on the given server and drops it after; with
    lease-bound fences not even the grant-to-first-write gap loses an update."""
    history = tmp_path / "history.jsonl"

    def run(seconds: float) -> tuple[ChaosResult, str]:
        out = io.StringIO()
        result = run_chaos(
            ChaosConfig(
                duration=seconds, seed=3, scope="lease-bound", workers=3, resources=2,
                history=history, dsn=pg_dsn,
            ),
            out=out,
            progress=print,
        )  # fmt: skip
        assert result.ok, out.getvalue()
        assert result.report.overlaps == 0, out.getvalue()
        assert result.report.gap_lost_updates == 0, out.getvalue()
        return result, out.getvalue()

    result, out = _until_exercised(
        run, lambda r: _short_of({"acknowledged": r[0].report.acknowledged}, {"acknowledged": 3}), 5
    )
    events = [json.loads(line) for line in history.read_text().splitlines()]
    _assert_workers_were_the_app_role(events, result.worker_role)
    assert f"workers: role {result.worker_role} (not a superuser" in out
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        left = conn.execute(
            "SELECT rolname FROM pg_roles WHERE rolname LIKE 'fencekit\\_chaos\\_worker\\_%'"
        ).fetchall()
        dbs = conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE 'fencekit\\_chaos\\_%'"
        ).fetchall()
    assert left == []
    assert dbs == []


@pytest.mark.parametrize("issuer", ["etcd", "zookeeper"])
def test_external_issuer_under_leader_kills_and_paused_members(
    issuer: str, pg_dsn: str, tmp_path: Path
) -> None:
    """Three-node cluster on loopback; its leader killed and members paused mid-run. A failed
    run's report shows, around each violation, the issuer's own account (ZooKeeper: why it
    declared a grant lost, its client's connection states), and its history is kept."""
    from tests.lab.issuers import ServerBinaryMissing, etcd_binary, zookeeper_classpath

    try:
        etcd_binary() if issuer == "etcd" else zookeeper_classpath()
    except ServerBinaryMissing as exc:
        if IN_CI:
            pytest.fail(str(exc))
        pytest.skip(str(exc))

    def run(seconds: float) -> tuple[ChaosResult, str]:
        out = io.StringIO()
        history = tmp_path / f"history-{seconds:g}s.jsonl"
        cfg = ChaosConfig(
            duration=seconds, seed=5, workers=4, resources=2, issuer=issuer, dsn=pg_dsn,
            history=history,
        )  # fmt: skip
        lab = LabEnvironment(LabOptions(crashes=False), cfg)
        result = run_chaos(cfg, out=out, progress=print, environment=lab)
        assert result.ok, f"{out.getvalue()}\nhistory: {history}"
        assert result.report.issuer == issuer
        if issuer == "zookeeper":  # the account a failure would be explained by is recorded
            events = [json.loads(line) for line in history.read_text().splitlines()]
            states = {e["msg"] for e in events if e["type"] == "log"}
            assert any("Zookeeper connection established" in m for m in states), states
        return result, out.getvalue()

    def short_of(r: tuple[ChaosResult, str]) -> list[str]:
        rep = r[0].report
        have = {
            "node_faults": rep.node_faults,
            "grants": rep.grants,
            "acknowledged": rep.acknowledged,
        }
        return _short_of(have, {"node_faults": 1, "grants": 3, "acknowledged": 5})

    _until_exercised(run, short_of, 7)


def test_bad_options_are_usage_errors(capsys) -> None:
    assert main(["chaos", "--scope", "lease-bound", "--issuer", "etcd"]) == 2
    assert "needs the postgres issuer" in capsys.readouterr().err
    # fencekit's own run takes etcd leases from the user's cluster: it must be named
    assert main(["chaos", "--issuer", "etcd", "--duration", "1"]) == 1
    assert "--endpoints host:port" in capsys.readouterr().err
    # server faults are the lab's: the installed command does not offer them
    assert main(["chaos", "--clock-faults"]) == 2
    assert "unrecognized arguments: --clock-faults" in capsys.readouterr().err
