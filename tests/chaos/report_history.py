"""A small chaos history with every mark the report draws: grants and renewals of two workers,
a pause of the holder past its lease, a takeover, accepted writes, rejections of several
reasons, a connection error, a write lost during COMMIT, and a fault of each kind."""

from __future__ import annotations

from typing import Any

from fencekit.chaos.checker import LogRow, final_state_events

T = 1_000_000.0


def history() -> list[dict[str, Any]]:
    n = iter(range(1, 1000))
    events: list[dict[str, Any]] = []

    def add(t: float, p: str, type_: str, **data: Any) -> None:
        events.append({"t": T + t, "p": p, "n": next(n), "type": type_, **data})

    add(0.0, "run", "run", scope="key", issuer="postgres", fenced=True)
    add(0.1, "w0", "acquire", resource="r0", token=1, holder="w0#1", t0=T + 0.1, ttl=1.0)
    add(0.2, "w0", "invoke", id="w0-1", resource="r0", token=1, observed=0, value=1)
    add(0.25, "w0", "ok", id="w0-1", seq=1)
    add(0.4, "w0", "renew", resource="r0", holder="w0#1", t0=T + 0.4)
    add(0.5, "nemesis", "pause", worker="w0", seconds=2.0)
    add(1.6, "w1", "acquire", resource="r0", token=2, holder="w1#1", t0=T + 1.6, ttl=1.0)
    add(1.7, "w1", "invoke", id="w1-1", resource="r0", token=2, observed=1, value=2)
    add(1.75, "w1", "ok", id="w1-1", seq=2)
    add(1.8, "w1", "invoke", id="w1-2", resource="r1", token=None, observed=0, value=1)
    add(1.85, "w1", "fail", id="w1-2", reason="missing", sqlstate="YF003", fence=None)
    add(2.5, "nemesis", "resume", worker="w0")
    add(2.55, "w0", "invoke", id="w0-2", resource="r0", token=1, observed=0, value=1)
    add(2.6, "w0", "fail", id="w0-2", reason="stale", sqlstate="YF001", fence=2)
    add(2.7, "w1", "release", resource="r0", holder="w1#1", t0=T + 2.7)
    add(2.8, "nemesis", "net", fault="pgbouncer paused (SIGSTOP)")
    add(2.9, "w1", "acquire", resource="r1", token=3, holder="w1#2", t0=T + 2.9, ttl=1.0)
    add(3.0, "w1", "invoke", id="w1-3", resource="r1", token=3, observed=0, value=1)
    add(3.1, "w1", "fail", id="w1-3", reason="connection", error="server closed the connection")
    add(3.2, "w1", "invoke", id="w1-4", resource="r1", token=3, observed=0, value=1)
    add(3.3, "w1", "info", id="w1-4", error="connection lost during COMMIT")
    add(3.4, "nemesis", "net", fault=None, action="pgbouncer resumed (SIGCONT)")
    add(3.5, "nemesis", "kill", worker="w0")
    add(3.6, "nemesis", "crash", what="server")
    add(3.7, "nemesis", "clock", target="workers", fault="step", what="+5s")
    add(3.9, "nemesis", "node", fault="leader killed (SIGKILL)", node="n1")
    add(4.0, "nemesis", "bouncer", fault="restart")
    add(4.1, "w1", "invoke", id="w1-5", resource="r1", token=3, observed=1, value=2)
    add(4.2, "w1", "fail", id="w1-5", reason="reused", sqlstate="YF002", fence=3)
    log = [
        LogRow("r0", 1, 1, 1, 0, "w0-1"),
        LogRow("r0", 2, 2, 2, 1, "w1-1"),
        LogRow("r1", 1, 3, 1, 0, "w1-4"),
    ]
    return events + final_state_events(log, {"r0": (2, 2), "r1": (1, 1)})
