"""A contention worker (run in its own process): grab leases on a few resources at random,
hold them briefly, then release, renew or abandon them; record every token received."""

from __future__ import annotations

import json
import os
import random
import time

from fencekit.leases import IssuerUnavailableError, PostgresIssuer

TTL = 0.15


def worker(dsn: str, resources: list[str], seconds: float, seed: int, out: str, stop: str) -> None:
    """Contend until the file ``stop`` exists, or ``seconds`` (a bound) have passed."""
    rng = random.Random(seed)
    records: list[list[object]] = []
    unavailable = 0
    issuer = PostgresIssuer(dsn, timeout=2)
    deadline = time.monotonic() + seconds
    attempt = 0
    while time.monotonic() < deadline and attempt < 50_000:
        attempt += 1
        if attempt % 20 == 0 and os.path.exists(stop):
            break
        resource = rng.choice(resources)
        holder = f"w{seed}-{attempt}"  # one holder per grant: overlaps are never "the same"
        try:
            grant = issuer.try_acquire(resource, holder, TTL)
        except IssuerUnavailableError:
            unavailable += 1
            time.sleep(0.05)
            continue
        if grant is None:
            time.sleep(rng.uniform(0, 0.01))
            continue
        records.append([resource, grant.token, holder, time.time()])
        ending = rng.choice(("release", "release", "renew", "abandon"))
        try:
            time.sleep(rng.uniform(0, 0.03))
            if ending == "renew":
                issuer.renew(grant)
                time.sleep(rng.uniform(0, 0.03))
                issuer.release(grant)
            elif ending == "release":
                issuer.release(grant)
            # "abandon": a holder that died; the lease expires by itself
        except IssuerUnavailableError:
            unavailable += 1
    issuer.close()
    with open(out, "w") as fh:
        json.dump({"records": records, "unavailable": unavailable, "attempts": attempt}, fh)
