"""Many processes contending for a few resources with short ttls, across a server crash.

Checked against the server's own record (a test-only trigger on fencekit.leases, written in
the same transactions as the grants): at every moment at most one holder per resource by the
database clock, tokens per resource strictly increasing, no token issued twice, every token a
client received durable across an immediate shutdown (crash) and restart.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import time
from collections import defaultdict

import psycopg
import pytest

from tests.leases._contention import worker

WORKERS = 6
RESOURCES = ["res:a", "res:b", "res:c"]
MAX_SECONDS = 60.0  # bound on each worker; the test stops them much earlier
PHASE_GRANTS = 100  # grants to see before the crash, and again after the restart


def _grants(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM public.lease_history WHERE kind = 'grant'")
        return int(row.fetchone()[0])  # type: ignore[index]


def _wait_grants(dsn: str, at_least: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _grants(dsn) < at_least:
        assert time.monotonic() < deadline, f"fewer than {at_least} grants after {timeout}s"
        time.sleep(0.1)


def _tokens(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return dict(conn.execute("SELECT resource, token FROM fencekit.leases").fetchall())


@pytest.mark.slow
@pytest.mark.multiproc
def test_contention_across_a_crash(restartable_pg, tmp_path) -> None:
    dsn = restartable_pg.dsn
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters: real separate clients
    outs = [tmp_path / f"w{i}.json" for i in range(WORKERS)]
    stop = tmp_path / "stop"
    procs = [
        ctx.Process(
            target=worker, args=(dsn, RESOURCES, MAX_SECONDS, i, str(out), str(stop)), daemon=True
        )
        for i, out in enumerate(outs)
    ]
    for p in procs:
        p.start()
    try:
        _wait_grants(dsn, PHASE_GRANTS, 45)  # workers start slowly on a loaded machine
        before = _tokens(dsn)
        restartable_pg.crash()
        time.sleep(0.3)
        restartable_pg.start()
        after_restart = _tokens(dsn)
        _wait_grants(dsn, _grants(dsn) + PHASE_GRANTS, 45)
        stop.touch()
        for p in procs:
            p.join(MAX_SECONDS + 30)
            assert p.exitcode == 0, f"worker {p.name} exit code {p.exitcode}"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()

    # Nothing committed before the crash was lost: the last tokens did not go back.
    assert before, "no grant before the crash: the test would prove nothing"
    for resource, token in before.items():
        assert after_restart[resource] >= token, (resource, token, after_restart[resource])

    results = [json.loads(out.read_text()) for out in outs]
    received = [tuple(r[:3]) for res in results for r in res["records"]]
    unavailable = sum(res["unavailable"] for res in results)

    with psycopg.connect(dsn, autocommit=True) as conn:
        history = conn.execute(
            "SELECT id, kind, resource, holder, token, acquired_at, expires_at, released_at "
            "FROM public.lease_history ORDER BY id"
        ).fetchall()

    grants: dict[str, list[tuple[int, str, object]]] = defaultdict(list)  # per resource
    ends: dict[tuple[str, int], object] = {}
    for _id, kind, resource, holder, token, acquired_at, expires_at, released_at in history:
        if kind == "grant":
            grants[resource].append((token, holder, acquired_at))
            ends[(resource, token)] = expires_at
        elif kind == "renew":
            ends[(resource, token)] = max(ends[(resource, token)], expires_at)
        else:  # release: the lease ended then (or earlier, if it had already expired)
            ends[(resource, token)] = min(ends[(resource, token)], released_at)

    # Tokens per resource strictly increase in grant order, none issued twice.
    for resource, seq in grants.items():
        tokens = [t for t, _, _ in seq]
        assert tokens == sorted(set(tokens)), f"{resource}: tokens not strictly increasing"
    # Every token a client received was durable: it is in the server's history (a lost commit
    # would let the next grant reissue it, which the client-side check below also catches).
    granted = {(r, t, h) for r, seq in grants.items() for t, h, _ in seq}
    missing = [g for g in received if g not in granted]
    assert not missing, f"tokens received by clients but lost by the server: {missing[:5]}"
    per_resource: dict[str, list[int]] = defaultdict(list)
    for resource, token, _holder in received:
        per_resource[resource].append(token)
    for resource, tokens in per_resource.items():
        assert len(tokens) == len(set(tokens)), f"{resource}: a token was issued twice"

    # At every moment at most one holder per resource, by the database clock: each grant
    # starts no earlier than its predecessor's lease ended (expiry or release).
    overlaps = []
    for resource, seq in grants.items():
        for (tok, holder, _), (next_tok, next_holder, next_at) in itertools.pairwise(seq):
            if holder != next_holder and next_at < ends[(resource, tok)]:
                overlaps.append((resource, tok, next_tok))
    assert not overlaps, f"two live holders at once: {overlaps[:5]}"

    # The run was not vacuous: plenty of grants, takeovers after expiry, grants after the crash.
    total = sum(len(seq) for seq in grants.values())
    after = sum(1 for r, seq in grants.items() for t, _, _ in seq if t > before.get(r, 0))
    print(
        f"\ncontention: {WORKERS} workers, {len(RESOURCES)} resources, {total} grants, "
        f"{len(received)} seen by clients, {after} after the crash, "
        f"{unavailable} calls failed during the restart"
    )
    assert total >= 2 * PHASE_GRANTS
    assert after >= PHASE_GRANTS
