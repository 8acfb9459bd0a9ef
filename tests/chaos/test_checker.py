"""The checker on hand-made histories: each invariant passes when it holds and fails when not.

A checker that cannot fail proves nothing, so every violation kind has a history that trips it.
"""

from __future__ import annotations

from typing import Any

from fencekit.chaos.checker import LogRow, check, format_report

_n = 0


def ev(t: float, p: str, type_: str, **data: Any) -> dict[str, Any]:
    global _n
    _n += 1
    return {"t": t, "p": p, "n": _n, "type": type_, **data}


def write(t: float, p: str, wid: str, token: int | None, observed: int, outcome: str, **o: Any):
    """invoke + outcome events of one write on resource r0."""
    out = [ev(t, p, "invoke", id=wid, resource="r0", token=token, observed=observed,
              value=observed + 1)]  # fmt: skip
    if outcome:
        out.append(ev(t + 0.01, p, outcome, id=wid, **o))
    return out


def good_history():
    events = [
        ev(0.0, "w0", "acquire", resource="r0", token=1),
        *write(0.1, "w0", "a", 1, 0, "ok", seq=1),
        ev(0.2, "nemesis", "pause", worker="w0"),
        ev(0.9, "w1", "acquire", resource="r0", token=2),
        *write(1.0, "w1", "b", 2, 1, "ok", seq=2),
        ev(1.1, "nemesis", "resume", worker="w0"),
        *write(1.2, "w0", "c", 1, 1, "fail", reason="stale", fence=2),
        *write(1.3, "w1", "d", None, 2, "fail", reason="missing"),
        ev(1.4, "nemesis", "crash"),
        *write(1.5, "w1", "e", 2, 2, "info", error="connection lost"),  # applied
        *write(1.6, "w1", "f", 2, 3, ""),  # worker killed: no outcome, not applied
        ev(1.7, "nemesis", "kill", worker="w1"),
    ]
    log = [
        LogRow("r0", 1, 1, 1, 0, "a"),
        LogRow("r0", 2, 2, 2, 1, "b"),
        LogRow("r0", 3, 2, 3, 2, "e"),
    ]
    return events, log, {"r0": (3, 3)}


def kinds(report) -> set[str]:
    return {v.kind for v in report.violations}


def test_a_consistent_history_passes_and_is_counted() -> None:
    events, log, register = good_history()
    r = check(events, log, register)
    assert r.violations == [], format_report(r)
    assert (r.writes, r.acknowledged, r.unknown, r.unknown_applied) == (6, 2, 2, 1)
    assert dict(r.rejected) == {"stale": 1, "missing": 1}
    assert (r.stale_attempted, r.stale_rejected) == (1, 1)
    assert (r.pauses, r.kills, r.crashes, r.handovers) == (1, 1, 1, 1)
    assert r.acked_before_crash == 2


def test_stale_write_accepted_is_a_lost_update() -> None:
    events, log, _register = good_history()
    events = [e for e in events if e.get("id") != "c"]
    events += write(1.2, "w0", "c", 1, 1, "ok", seq=4)
    log = [*log, LogRow("r0", 4, 1, 2, 1, "c")]
    r = check(events, log, {"r0": (2, 4)})
    assert kinds(r) == {"stale write accepted"}
    assert r.lost_updates == 1
    assert r.stale_accepted == 1
    text = format_report(r)
    assert "lost update" in text
    assert "token 1" in text


def test_acknowledged_write_missing_after_a_crash() -> None:
    events, log, _ = good_history()
    r = check(events, log[:1] + log[2:], {"r0": (3, 2)})
    assert "acknowledged write lost" in kinds(r)


def test_rejected_write_that_was_applied() -> None:
    events, log, _ = good_history()
    log = [*log, LogRow("r0", 4, 1, 2, 1, "c")]
    r = check(events, log, {"r0": (2, 4)})
    assert "rejected write applied" in kinds(r)


def test_unfenced_write_accepted() -> None:
    events, log, _ = good_history()
    events = [e for e in events if e.get("id") != "d"]
    events += write(1.3, "w1", "d", None, 3, "ok", seq=4)
    r = check(events, [*log, LogRow("r0", 4, None, 4, 3, "d")], {"r0": (4, 4)})
    assert kinds(r) == {"unfenced write accepted"}


def test_unjustified_rejections() -> None:
    events, log, register = good_history()
    # A "stale" rejection naming a fence no committed write carried, and a "missing" one for
    # a write that had a token.
    events += write(2.0, "w1", "g", 2, 3, "fail", reason="stale", fence=7)
    events += write(2.1, "w1", "h", 2, 3, "fail", reason="missing")
    r = check(events, log, register)
    assert [v.kind for v in r.violations] == ["unjustified rejection"] * 2


def test_final_state_differs_from_replay() -> None:
    events, log, _ = good_history()
    r = check(events, log, {"r0": (99, 3)})
    assert kinds(r) == {"final state differs from replay"}


def test_phantom_and_misplaced_writes() -> None:
    events, log, register = good_history()
    log = [LogRow("r0", 1, 1, 1, 0, "a"), LogRow("r0", 2, 2, 2, 1, "zz"),
           LogRow("r0", 3, 2, 3, 2, "b")]  # fmt: skip
    r = check(events, log, register)
    assert {"phantom write", "acknowledged at another position"} <= kinds(r)


def test_overlaps_are_violations_only_for_lease_bound_fences() -> None:
    events, log, register = good_history()
    log[1] = LogRow("r0", 2, 2, 2, 0, "b")  # b read 0, though a had written 1 before it
    assert check(events, log, register).violations == []
    assert check(events, log, register).overlaps == 1
    r = check(events, log, register, lease_bound=True)
    assert kinds(r) == {"overlapping read-modify-write"}
