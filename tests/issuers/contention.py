"""A bounded contention run: several workers, each with its own issuer (own connection or
session), race for one resource with non-blocking attempts, hold it briefly, release it.

Every acquisition is recorded in the order the workers took the lock; an in-process
critical-section check records any two workers that believed they held the lock at once.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fencekit.errors import IssuerUnavailableError


@dataclass
class Acquisition:
    worker: str
    token: int
    at: float
    grant: Any


@dataclass
class ContentionResult:
    acquisitions: list[Acquisition] = field(default_factory=list)
    overlaps: list[tuple[str, str]] = field(default_factory=list)
    attempts: int = 0
    refused: int = 0
    unavailable: int = 0
    errors: list[BaseException] = field(default_factory=list)

    @property
    def tokens(self) -> list[int]:
        return [a.token for a in self.acquisitions]

    @property
    def handovers(self) -> int:
        """Acquisitions whose holder differs from the previous one."""
        return sum(
            1
            for prev, cur in zip(self.acquisitions, self.acquisitions[1:], strict=False)
            if prev.worker != cur.worker
        )


def run_contention(
    make_issuer: Callable[[], Any],
    resource: str,
    *,
    workers: int = 3,
    duration: float = 3.0,
    max_acquisitions_per_worker: int = 200,
    hold: float = 0.01,
    ttl: float = 5.0,
) -> ContentionResult:
    result = ContentionResult()
    lock = threading.Lock()
    current: list[str | None] = [None]
    issuers = [make_issuer() for _ in range(workers)]
    deadline = time.monotonic() + duration

    def work(name: str, issuer: Any) -> None:
        rnd = random.Random(name)
        mine = 0
        try:
            while time.monotonic() < deadline and mine < max_acquisitions_per_worker:
                with lock:
                    result.attempts += 1
                try:
                    grant = issuer.try_acquire(resource, name, ttl)
                except IssuerUnavailableError:
                    with lock:
                        result.unavailable += 1
                    time.sleep(0.05)
                    continue
                if grant is None:
                    with lock:
                        result.refused += 1
                    time.sleep(rnd.uniform(0.0, 0.01))
                    continue
                mine += 1
                with lock:
                    if current[0] is not None:
                        result.overlaps.append((current[0], name))
                    current[0] = name
                    result.acquisitions.append(
                        Acquisition(name, grant.token, time.monotonic(), grant)
                    )
                time.sleep(hold)
                with lock:
                    if current[0] == name:
                        current[0] = None
                issuer.release(grant)
                time.sleep(rnd.uniform(0.0, 0.005))
        except BaseException as exc:  # reported by the test
            with lock:
                result.errors.append(exc)

    threads = [
        threading.Thread(target=work, args=(f"w{i}", iss), daemon=True)
        for i, iss in enumerate(issuers)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=duration + 60)
    for t in threads:
        if t.is_alive():
            result.errors.append(RuntimeError(f"{t.name} did not finish"))
    return result


def assert_strictly_increasing(tokens: list[int]) -> None:
    bad = [(a, b) for a, b in itertools.pairwise(tokens) if not a < b]
    assert not bad, f"tokens not strictly increasing at {bad[:5]} (of {len(tokens)})"
