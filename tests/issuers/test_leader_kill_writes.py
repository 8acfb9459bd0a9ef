"""Kill the etcd leader in the middle of a contention run where workers WRITE to PostgreSQL.

Three worker processes (tests/issuers/fence_worker.py, loop mode) contend for one resource on a
three-member etcd cluster. Each tenure: acquire, claim-and-read the fenced counter, "compute",
write ``value + 1`` and a log row, release. Meanwhile the test SIGSTOPs a holder between its
claim and its write, past its lease (a paused worker), several times, and SIGKILLs the Raft
leader (restarting it as a follower later).

What must hold, checked from the workers' events, etcd's own history and the database:

- tokens strictly increase per worker and never repeat across workers; by etcd's history no two
  holders overlapped (at every grant's revision its key was the only live one);
- accepted writes committed in strictly increasing token order, and the counter equals the
  number of accepted writes (no lost update);
- every stale write is rejected (YF001): a paused worker whose resource another holder claimed
  or wrote during the pause; and every rejection is justified (a higher token wrote first);
- the run went on across the leader change (acquisitions before and after).
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import pytest

from fencekit.leases.base import Grant
from tests.issuers.contention import assert_strictly_increasing
from tests.issuers.pgfence import RESOURCE, make_counter, state
from tests.issuers.procs import Events, Worker, workers
from tests.lab import IN_CI

pytestmark = [pytest.mark.slow, pytest.mark.multiproc]

if not IN_CI:
    pytest.importorskip("etcd3gw")

WORKERS = 3
DURATION = 16.0  # seconds of contention per worker
TTL = 2.0  # etcd's minimum with the test cluster's 1 s election timeout
PAUSE = 4.0  # > TTL, with room for an election's lease extension and the takeover
MAX_PAUSES = 3
KILL_AT = 5.0


def test_leader_kill_with_paused_writers(etcd: Any, etcd_issuer: Any, db: Any, dsn: str) -> None:
    from fencekit.leases.etcd import EtcdHandle
    from tests.issuers.test_etcd_issuer import assert_issuer_view_exclusive

    make_counter(db, "etcd")
    lease_resource = f"{RESOURCE}:1:{time.monotonic_ns()}"
    events = Events()
    args = ["--issuer", "etcd", "--endpoints", ",".join(etcd.endpoints), "--dsn", dsn]
    args += ["--resource", lease_resource, "--mode", "loop", "--ttl", str(TTL)]
    args += ["--duration", str(DURATION), "--wait", "1.0", "--compute", "0.3"]
    pauses: list[dict[str, Any]] = []
    chaos: dict[str, Any] = {}

    def kill_and_restart() -> None:
        try:
            killed = etcd.kill_leader()
            chaos["killed_at"] = time.monotonic()
            chaos["killed"] = killed.name
            chaos["new_leader"] = etcd.leader(timeout=15).name
            time.sleep(3.0)
            etcd.restart_member(killed)
            chaos["restarted_at"] = time.monotonic()
        except BaseException as exc:  # reported below
            chaos["error"] = exc

    with workers() as made:
        t0 = time.monotonic()
        for i in range(WORKERS):
            made.append(Worker(f"w{i}", events, args))
        by_name = {w.name: w for w in made}
        killer = threading.Thread(target=kill_and_restart, daemon=True)
        paused: dict[str, Any] | None = None
        exited: set[str] = set()
        deadline = t0 + DURATION + 60
        while len(exited) < WORKERS:
            now = time.monotonic()
            assert now < deadline, f"run did not finish; last events {events.seen[-10:]}"
            # The leader dies once the run is under way: after KILL_AT and three tenures (a
            # loaded machine starts the workers late; the test asserts tenures on both sides).
            held = sum(1 for e in events.seen if e["event"] == "holding")
            if not chaos and now - t0 >= KILL_AT and held >= 3:
                chaos["started"] = True
                killer.start()
            if paused is not None and now >= paused["until"]:
                by_name[paused["who"]].cont()
                paused["end"] = time.monotonic()
                paused = None
            ev = events.get(0.05)
            if ev is None:
                continue
            if ev["event"] == "exit":
                exited.add(ev["who"])
            elif (
                ev["event"] == "read"
                and ev.get("outcome") == "claimed"
                and paused is None
                and len(pauses) < MAX_PAUSES
                and now - t0 >= 1.0
                and now - t0 <= DURATION - PAUSE - 0.5
                and (not pauses or now - pauses[-1]["end"] >= 0.3)
            ):
                # Between its claim and its write (it "computes" for 0.3 s): freeze it.
                by_name[ev["who"]].stop()
                paused = {"who": ev["who"], "token": ev["token"], "start": time.monotonic()}
                paused["until"] = paused["start"] + PAUSE
                pauses.append(paused)
        killer.join(timeout=60)
        stderr = {w.name: w.stderr for w in made}
    assert "error" not in chaos, chaos
    assert "killed_at" in chaos, "the leader was never killed"

    seen = events.seen
    errors = [e for e in seen if e["event"] == "error"]
    assert not errors, (errors, stderr)
    holds = [e for e in seen if e["event"] == "holding"]
    results = [e for e in seen if e["event"] == "result"]
    claims = [e for e in seen if e["event"] == "read"]

    # -- tokens and exclusion, by the workers and by etcd's history
    tokens = [e["token"] for e in holds]
    assert len(set(tokens)) == len(tokens), "a token was granted twice"
    for name in by_name:
        assert_strictly_increasing([e["token"] for e in holds if e["who"] == name])
    grants = [
        Grant(
            lease_resource,
            e["who"],
            e["token"],
            TTL,
            "etcd",
            handle=EtcdHandle(key=e["key"], lease_id=e["lease_id"]),
        )
        for e in holds
    ]
    assert_issuer_view_exclusive(etcd_issuer(), lease_resource, grants)
    before = [e for e in holds if e["at"] < chaos["killed_at"]]
    after = [e for e in holds if e["at"] > chaos["killed_at"]]
    assert len(before) >= 3, (len(before), len(after))
    assert len(after) >= 3, (len(before), len(after))
    handovers = sum(1 for p, c in itertools.pairwise(holds) if p["who"] != c["who"])
    assert handovers >= 5, handovers

    # -- the database's view
    value, writes, rejections = state(dsn)
    accepted = [e for e in results if e["outcome"] == "written"]
    rejected = [e for e in results if e["outcome"] == "rejected"]
    claim_rejected = [e for e in claims if e["outcome"] == "rejected"]
    assert sorted((w[0], w[1]) for w in writes) == sorted((e["who"], e["token"]) for e in accepted)
    assert_strictly_increasing([w[1] for w in writes])
    assert value == len(writes), f"lost update: counter {value}, accepted writes {len(writes)}"
    assert all(e["sqlstate"] == "YF001" for e in rejected + claim_rejected), rejected
    assert rejections.get("stale", 0) == len(rejected) + len(claim_rejected)
    fenced_tokens = [w[1] for w in writes] + [
        e["token"] for e in claims if e["outcome"] == "claimed"
    ]
    for e in rejected:  # justified: a higher token had claimed or written
        assert any(t > e["token"] for t in fenced_tokens), e

    # -- every stale write of a paused worker was rejected
    stale_checked = 0
    for p in pauses:
        end = p.get("end", float("inf"))
        overtaken = [
            e
            for e in claims + results
            if e["who"] != p["who"]
            and e.get("outcome") in ("claimed", "written")
            and p["start"] < e["at"] < end
            and e["token"] > p["token"]
        ]
        mine = [e for e in results if e["who"] == p["who"] and e["token"] == p["token"]]
        if overtaken and mine:
            assert mine[0]["outcome"] == "rejected", (p, mine, overtaken[:2])
            stale_checked += 1
    timeline = [
        (round(e["at"] - t0, 2), e["who"], e["event"], e.get("token"), e.get("outcome"))
        for e in seen
        if e["event"] in ("holding", "read", "result")
    ]
    assert stale_checked >= 2, (
        [(round(p["start"] - t0, 2), round(p.get("end", 0) - t0, 2), p["who"]) for p in pauses],
        round(chaos["killed_at"] - t0, 2),
        timeline,
    )
    print(
        f"etcd leader kill with writes: {len(holds)} acquisitions ({len(before)} before the kill, "
        f"{len(after)} after), {handovers} handovers, {len(accepted)} writes accepted, "
        f"{len(rejected)} stale writes rejected ({stale_checked} by paused workers that were "
        f"overtaken), {len(claim_rejected)} stale claims rejected, {len(pauses)} pauses; killed "
        f"{chaos['killed']}, new leader {chaos['new_leader']}"
    )
