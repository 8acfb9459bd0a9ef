"""Check a chaos history: lease safety, the fence, durability, lost updates.

The entry point is :func:`check`, a plain function over a history (a list of events as
:mod:`fencekit.chaos.history` describes them, ending with the database's final state as
``committed`` and ``register`` events). It reads nothing else, so a history saved from any
system that writes these events can be checked (``fencekit chaos check HISTORY``).

Checks (each failure is a :class:`Violation` with its kind's name):

Lease safety, per resource, from the ``acquire`` / ``renew`` / ``release`` events:

- **duplicate token** / **reused token**: two grants to different holders with one token, while
  the first was still live / after it ended.
- **token went down**: a grant whose acquire started after another grant had completed, with a
  lower token (tokens must rise in real time, not only in some order).
- **lease overlap**: a grant completed while an earlier grant was certainly live (granted, and
  not yet released nor past ttl after its last successful renewal was *sent*), unless the
  issuer's contract allows it (:mod:`fencekit.chaos.contracts`: a PostgreSQL issuer's lease
  may end early while the server's clock is faulted, an old etcd's while a member is paused;
  those overlaps are counted on their own).

The fence, over the committed writes in commit order (``seq``):

- **stale write accepted**: a committed token lower than an earlier committed one (the fence
  was off, or broken).
- **unfenced write accepted**: a committed write without a token.
- **write accepted after a newer grant** (lease-bound scope only): a write sent after a newer
  lease on its resource was granted, and committed.
- **lost update**: a committed write overwritten by one that read before it, where fencing
  should have stopped it (lease-bound scope; equal or missing tokens in any scope). In key and
  row scope an overwrite by a *newer* holder is the **grant-to-first-write gap**: an old holder
  wrote after the new grant but before the new holder's first write, so its token was not yet
  stale. Fencing alone cannot close it; it is reported under its own name with its count, and
  what closes it (lease-bound fences, or a write that checks what it read).

Durability and outcomes:

- **acknowledged write lost** / **acknowledged at another position**: an ``ok`` write missing
  from the final state, or at another ``seq`` than its client was told.
- **failed write applied**: a write reported as not applied (``fail``) that is committed.
- **phantom write**: a committed write never attempted.
- **unjustified rejection**: a rejection the history does not support.
- **final state differs from replay**: the register is not the replay of the committed writes.

Indeterminate writes (``info``, or an ``invoke`` with no outcome: the commit's fate is unknown)
are treated as Jepsen treats an ``:info`` operation: they may or may not have happened. The
final state decides: committed, they are judged like any committed write; absent, they are
neither lost (nobody was told they succeeded) nor applied.

The summary's figures that name a kind of violation are counted from the violation list itself,
so the summary and the violations cannot disagree.
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from fencekit.chaos.contracts import CLOCK_NOTE, IssuerContract, contract_for
from fencekit.chaos.history import Event
from fencekit.errors import HistoryError

__all__ = [
    "KINDS",
    "LogRow",
    "Report",
    "Violation",
    "check",
    "final_state_events",
    "format_report",
]

FENCE_REASONS = ("stale", "missing", "lease_mismatch", "reused", "malformed")
STALE_REASONS = ("stale", "lease_mismatch", "reused")
SCOPES = ("key", "row", "lease-bound")

#: Every violation kind, in the order the report lists them.
KINDS = (
    "duplicate token",
    "reused token",
    "token went down",
    "lease overlap",
    "stale write accepted",
    "unfenced write accepted",
    "write accepted after a newer grant",
    "lost update",
    "acknowledged write lost",
    "acknowledged at another position",
    "failed write applied",
    "phantom write",
    "unjustified rejection",
    "final state differs from replay",
)

GAP = "grant-to-first-write gap"
GAP_CLOSES = (
    "fencing alone cannot close it (the old token is not stale until the new holder writes); "
    "lease-bound fences close it (--scope lease-bound), or a write that checks the value it "
    "read (compare-and-set)"
)
_CONTEXT_FOR = 30  # violations that get the history lines around them
_CONTEXT_LINES = 24  # history lines shown around each of them
_CONTEXT_BEFORE = 16  # of which at most this many up to the violation's time


@dataclass(frozen=True)
class LogRow:
    """One committed write, as ``chaos_log`` holds it after the run."""

    resource: str
    seq: int
    token: int | None
    value: int
    observed: int
    write_id: str


@dataclass
class Violation:
    kind: str
    resource: str | None
    message: str
    t: float | None = None
    seq: int | None = None
    context: list[str] = field(default_factory=list)


@dataclass
class _Grant:
    resource: str
    token: int
    holder: str
    p: str
    t0: float  # the acquire request was sent
    t: float  # the grant was known to the holder
    ttl: float
    last_ok: float  # the last successful acquire/renew request was sent
    released: float | None = None  # the release request was sent

    @property
    def live_until(self) -> float:
        """Until when the grant was certainly live, by the issuer's contract."""
        end = self.last_ok + self.ttl
        return end if self.released is None else min(end, self.released)


@dataclass
class Report:
    scope: str = "key"
    issuer: str = "postgres"
    issuer_version: str | None = None
    fenced: bool = True
    writes: int = 0
    acknowledged: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    unknown: int = 0
    unknown_applied: int = 0
    unfenced_attempts: int = 0
    stale_rejected: int = 0
    stale_other: int = 0  # certainly stale writes that neither committed nor were rejected
    gap_lost_updates: int = 0
    gap_writes: int = 0
    clock_overlaps: int = 0
    overlaps: int = 0  # read-modify-write overlaps of any kind (all lost updates)
    grants: int = 0
    handovers: int = 0
    pauses: int = 0
    kills: int = 0
    crashes: int = 0
    bouncer_restarts: int = 0
    clock_faults: int = 0
    net_faults: int = 0
    node_faults: int = 0
    acked_before_crash: int = 0
    final_state: bool = True
    violations: list[Violation] = field(default_factory=list)

    def count(self, kind: str) -> int:
        return sum(1 for v in self.violations if v.kind == kind)

    @property
    def stale_accepted(self) -> int:
        return self.count("stale write accepted") + self.count("write accepted after a newer grant")

    @property
    def stale_attempted(self) -> int:
        return self.stale_rejected + self.stale_accepted + self.stale_other

    @property
    def lost_updates(self) -> int:
        """Lost updates that are violations (the gap's are :attr:`gap_lost_updates`)."""
        return self.count("lost update") + self.count("stale write accepted")

    @property
    def by_kind(self) -> dict[str, int]:
        return dict(Counter(v.kind for v in self.violations))

    def as_dict(self) -> dict[str, Any]:
        return {
            "scope": self.scope,
            "issuer": self.issuer,
            "issuer_version": self.issuer_version,
            "fenced": self.fenced,
            "writes": self.writes,
            "acknowledged": self.acknowledged,
            "rejected": dict(self.rejected),
            "unknown": self.unknown,
            "unknown_applied": self.unknown_applied,
            "unfenced_attempts": self.unfenced_attempts,
            "stale_attempted": self.stale_attempted,
            "stale_rejected": self.stale_rejected,
            "stale_other": self.stale_other,
            "stale_accepted": self.stale_accepted,
            "lost_updates": self.lost_updates,
            "gap_lost_updates": self.gap_lost_updates,
            "gap_writes": self.gap_writes,
            "clock_overlaps": self.clock_overlaps,
            "overlaps": self.overlaps,
            "grants": self.grants,
            "handovers": self.handovers,
            "pauses": self.pauses,
            "kills": self.kills,
            "crashes": self.crashes,
            "bouncer_restarts": self.bouncer_restarts,
            "clock_faults": self.clock_faults,
            "net_faults": self.net_faults,
            "node_faults": self.node_faults,
            "acked_before_crash": self.acked_before_crash,
            "violations": len(self.violations),
            "violations_by_kind": self.by_kind,
        }


def final_state_events(log: list[LogRow], register: dict[str, tuple[int, int]]) -> list[Event]:
    """The database's final state as history events (appended after the run's own)."""
    out: list[Event] = []
    for row in sorted(log, key=lambda r: (r.resource, r.seq)):
        out.append(
            {"t": 0.0, "p": "final", "n": 0, "type": "committed", "resource": row.resource,
             "seq": row.seq, "token": row.token, "value": row.value,
             "observed": row.observed, "id": row.write_id}
        )  # fmt: skip
    for res, (value, count) in sorted(register.items()):
        out.append(
            {"t": 0.0, "p": "final", "n": 0, "type": "register", "resource": res,
             "value": value, "count": count}
        )  # fmt: skip
    return out


class _Checker:
    def __init__(self, events: list[Event], scope: str | None, issuer: str | None) -> None:
        run = next((e for e in events if e.get("type") == "run"), {})
        self.scope = scope or str(run.get("scope") or "key")
        if self.scope not in SCOPES:
            raise HistoryError(f"scope must be one of {', '.join(SCOPES)}, not {self.scope!r}")
        version = run.get("issuer_version")
        version = None if version is None else str(version)
        self.contract: IssuerContract = contract_for(
            issuer or run.get("issuer") or "postgres", version
        )
        self.lease_bound = self.scope == "lease-bound"
        self.r = Report(
            scope=self.scope, issuer=self.contract.issuer, issuer_version=version,
            fenced=bool(run.get("fence", True)),
        )  # fmt: skip
        self.events = sorted(
            (e for e in events if e.get("type") not in ("committed", "register")),
            key=lambda e: (float(e["t"]), str(e.get("p", "")), int(e.get("n", 0))),
        )
        self.times = [float(e["t"]) for e in self.events]
        self.invokes: dict[str, Event] = {}
        self.outcomes: dict[str, Event] = {}
        for e in self.events:
            if e["type"] == "invoke":
                self.invokes[str(e["id"])] = e
            elif e["type"] in ("ok", "fail", "info"):
                self.outcomes[str(e["id"])] = e
        self.log: list[LogRow] = []
        self.register: dict[str, tuple[int, int]] = {}
        finals = [e for e in events if e.get("type") in ("committed", "register")]
        self.r.final_state = bool(finals)
        for e in finals:
            if e["type"] == "committed":
                tok = e.get("token")
                self.log.append(
                    LogRow(str(e["resource"]), int(e["seq"]), None if tok is None else int(tok),
                           int(e["value"]), int(e["observed"]), str(e["id"]))
                )  # fmt: skip
            else:
                self.register[str(e["resource"])] = (int(e["value"]), int(e["count"]))
        self.log_by_id = {row.write_id: row for row in self.log}
        self.by_resource: dict[str, list[LogRow]] = defaultdict(list)
        for row in sorted(self.log, key=lambda x: (x.resource, x.seq)):
            self.by_resource[row.resource].append(row)
        self.grants: dict[str, list[_Grant]] = defaultdict(list)
        self.clock_windows: list[tuple[float, float]] = []

    # ------------------------------------------------------------ reporting

    def violate(
        self, kind: str, resource: str | None, message: str, t: float | None, seq: int | None
    ) -> None:
        context = self.around(resource, t, seq) if len(self.r.violations) < _CONTEXT_FOR else []
        self.r.violations.append(Violation(kind, resource, message, t, seq, context))

    def around(self, resource: str | None, t: float | None, seq: int | None) -> list[str]:
        """History lines near ``t`` on ``resource`` (and the nemesis' actions), and log rows."""
        lines: list[str] = []
        if t is not None:
            lo = bisect.bisect_left(self.times, t - 2.0)
            hi = bisect.bisect_right(self.times, t + 0.5)
            window = self.events[lo:hi]
            # The issuer's log lines of the processes that touched the resource here (which
            # connection state its client was in, why it declared a grant lost) explain an
            # overlap; every other process' would drown them.
            involved = {e.get("p") for e in window if self._resource_of(e) == resource}
            near = [
                e for e in window
                if (e.get("p") in involved if e["type"] == "log" else e["type"] != "session"
                    and self._resource_of(e) in (None, resource))
            ]  # fmt: skip
            # Mostly what led up to ``t``, then what followed.
            before = [e for e in near if float(e["t"]) <= t][-_CONTEXT_BEFORE:]
            after = [e for e in near if float(e["t"]) > t]
            after = after[: _CONTEXT_LINES - len(before)]
            lines += [_fmt_event(e, self.invokes) for e in before + after]
        if resource is not None and seq is not None:
            lines += [
                f"    log {row.resource} seq={row.seq} token={row.token} observed={row.observed} "
                f"value={row.value} id={row.write_id}"
                for row in self.by_resource.get(resource, [])
                if seq - 3 <= row.seq <= seq + 1
            ]
        return lines

    def _resource_of(self, e: Event) -> str | None:
        if "resource" in e:
            return str(e["resource"])
        inv = self.invokes.get(str(e.get("id", "")))
        return None if inv is None else str(inv["resource"])

    def _t(self, row: LogRow) -> float | None:
        e = self.outcomes.get(row.write_id) or self.invokes.get(row.write_id)
        return None if e is None else float(e["t"])

    # ------------------------------------------------------------ the run

    def run(self) -> Report:
        self.faults()
        self.collect_grants()
        self.lease_safety()
        self.outcome_counts()
        self.durability()
        self.token_order()
        self.lost_updates()
        self.rejections()
        if self.r.final_state:
            self.replay()
        self.stale_attempts()
        order = {k: i for i, k in enumerate(KINDS)}
        self.r.violations.sort(key=lambda v: (order.get(v.kind, 99), v.t or 0.0))
        return self.r

    def faults(self) -> None:
        kinds = Counter(e["type"] for e in self.events)
        r = self.r
        r.pauses, r.kills = kinds["pause"], kinds["kill"]
        r.crashes, r.bouncer_restarts = kinds["crash"], kinds["bouncer"]
        r.clock_faults = sum(1 for e in self.events if e["type"] == "clock" and e.get("fault"))
        r.net_faults = sum(1 for e in self.events if e["type"] == "net" and e.get("fault"))
        r.node_faults = sum(1 for e in self.events if e["type"] == "node" and e.get("fault"))
        # Windows in which a clock the issuer's contract depends on was faulted.
        start: dict[str, float] = {}
        for e in self.events:
            if e["type"] != "clock" or e.get("target") not in self.contract.clocks:
                continue
            target = str(e["target"])
            if e.get("fault") and target not in start:
                start[target] = float(e["t"])
            elif not e.get("fault") and target in start:
                self.clock_windows.append((start.pop(target), float(e["t"])))
        end = self.times[-1] if self.times else 0.0
        self.clock_windows += [(s, end + 1e9) for s in start.values()]
        if self.contract.member_pause_is_clock_fault:
            # From the pause until a second after the resume: the resumed member's lease
            # expiry pass runs every half second.
            paused: dict[str, float] = {}
            for e in self.events:
                if e["type"] != "node":
                    continue
                node = str(e.get("node"))
                if e.get("fault") and e.get("pause"):
                    paused.setdefault(node, float(e["t"]))
                elif not e.get("fault") and node in paused:
                    self.clock_windows.append((paused.pop(node), float(e["t"]) + 1.0))
            self.clock_windows += [(s, end + 1e9) for s in paused.values()]

    def collect_grants(self) -> None:
        by_holder: dict[str, _Grant] = {}
        for e in self.events:
            kind = e["type"]
            if kind == "acquire":
                t = float(e["t"])
                g = _Grant(
                    str(e["resource"]), int(e["token"]), str(e.get("holder") or e["p"]),
                    str(e["p"]), _sent(e), t, float(e.get("ttl") or 0.0), _sent(e),
                )  # fmt: skip
                self.grants[g.resource].append(g)
                by_holder[g.holder] = g
            elif kind in ("renew", "release") and str(e.get("holder")) in by_holder:
                g = by_holder[str(e["holder"])]
                t0 = _sent(e)
                if kind == "renew":
                    g.last_ok = max(g.last_ok, t0)
                elif g.released is None:
                    g.released = t0
        for gs in self.grants.values():
            gs.sort(key=lambda g: (g.t, g.token))
            self.r.grants += len(gs)
            by_token = sorted(gs, key=lambda g: g.token)
            self.r.handovers += sum(1 for a, b in itertools.pairwise(by_token) if a.p != b.p)

    def _clock_faulted(self, lo: float, hi: float) -> bool:
        return any(s <= hi and lo <= e for s, e in self.clock_windows)

    def lease_safety(self) -> None:
        for resource, gs in self.grants.items():
            # One token, one grant: a second holder with the same token is a duplicate while
            # the first may still be live, and a reuse once it has certainly ended.
            first: dict[int, _Grant] = {}
            for g in gs:
                a = first.setdefault(g.token, g)
                if a is g or a.holder == g.holder:
                    continue
                kind = "duplicate token" if g.t0 < a.live_until else "reused token"
                self.violate(
                    kind, resource,
                    f"token {g.token} granted to {g.holder} ({g.p}) at {g.t % 1000:.3f} was "
                    f"already granted to {a.holder} ({a.p}) at {a.t % 1000:.3f}", g.t, None,
                )  # fmt: skip
            # Real-time order: a grant whose acquire started after another had completed
            # must carry a higher token (equal tokens are reported above).
            done = sorted(gs, key=lambda g: g.t)
            top: _Grant | None = None
            i = 0
            for g in sorted(gs, key=lambda g: g.t0):
                while i < len(done) and done[i].t < g.t0:
                    if top is None or done[i].token > top.token:
                        top = done[i]
                    i += 1
                if top is not None and g.token < top.token:
                    self.violate(
                        "token went down", resource,
                        f"{g.holder} ({g.p}) was granted token {g.token} by an acquire sent at "
                        f"{g.t0 % 1000:.3f}, after {top.holder} ({top.p}) had been granted token "
                        f"{top.token} (at {top.t % 1000:.3f})", g.t, None,
                    )  # fmt: skip
            # Mutual exclusion: no grant completes while an earlier one is certainly live.
            live: _Grant | None = None
            i = 0
            for g in sorted(gs, key=lambda g: g.t0):
                while i < len(done) and done[i].t <= g.t0:
                    if live is None or done[i].live_until > live.live_until:
                        live = done[i]
                    i += 1
                if live is None or live.holder == g.holder or g.t >= live.live_until:
                    continue
                if self._clock_faulted(live.t0, g.t):
                    self.r.clock_overlaps += 1
                    continue
                self.violate(
                    "lease overlap", resource,
                    f"{g.holder} ({g.p}) was granted token {g.token} at {g.t % 1000:.3f} while "
                    f"{live.holder} ({live.p}, token {live.token}) held the lease until at "
                    f"least {live.live_until % 1000:.3f}, beyond the {self.contract.issuer} "
                    "issuer's contract", g.t, None,
                )  # fmt: skip

    def outcome_counts(self) -> None:
        r = self.r
        r.writes = len(self.invokes)
        r.unfenced_attempts = sum(1 for e in self.invokes.values() if e.get("token") is None)
        for wid in self.invokes:
            out = self.outcomes.get(wid)
            if out is None or out["type"] == "info":
                r.unknown += 1
                r.unknown_applied += wid in self.log_by_id
            elif out["type"] == "ok":
                r.acknowledged += 1
            else:
                r.rejected[str(out.get("reason"))] += 1
        crashes = [float(e["t"]) for e in self.events if e["type"] == "crash"]
        if crashes:
            last = max(crashes)
            r.acked_before_crash = sum(
                1 for o in self.outcomes.values() if o["type"] == "ok" and o["t"] < last
            )

    def durability(self) -> None:
        if not self.r.final_state:
            return
        for wid, out in self.outcomes.items():
            inv = self.invokes.get(wid)
            res = None if inv is None else str(inv["resource"])
            row = self.log_by_id.get(wid)
            if out["type"] == "ok":
                if row is None:
                    self.violate(
                        "acknowledged write lost", res,
                        f"write {wid} was acknowledged (seq {out.get('seq')}) but is not in the "
                        "final state", out["t"], out.get("seq"),
                    )  # fmt: skip
                elif out.get("seq") is not None and row.seq != out.get("seq"):
                    self.violate(
                        "acknowledged at another position", res,
                        f"write {wid} was acknowledged at seq {out.get('seq')} but committed at "
                        f"seq {row.seq}", out["t"], row.seq,
                    )  # fmt: skip
            elif out["type"] == "fail" and row is not None:
                self.violate(
                    "failed write applied", res,
                    f"write {wid} was reported as not applied ({out.get('reason')}) but is "
                    f"committed at seq {row.seq}", out["t"], row.seq,
                )  # fmt: skip
        for row in self.log:
            if row.write_id not in self.invokes:
                self.violate(
                    "phantom write", row.resource,
                    f"committed write {row.write_id} (seq {row.seq}) was never attempted",
                    None, row.seq,
                )  # fmt: skip

    def token_order(self) -> None:
        # Per resource: grant completion times, and the highest token granted by each.
        grant_t: dict[str, tuple[list[float], list[int]]] = {}
        for res, gs in self.grants.items():
            pairs = sorted((g.t, g.token) for g in gs)
            highs = list(itertools.accumulate((tok for _, tok in pairs), max))
            grant_t[res] = ([t for t, _ in pairs], highs)
        for resource, rows in self.by_resource.items():
            top: LogRow | None = None
            for row in rows:
                if row.token is None:
                    self.violate(
                        "unfenced write accepted", resource,
                        f"write {row.write_id} carried no token and was committed at seq "
                        f"{row.seq}", self._t(row), row.seq,
                    )  # fmt: skip
                    continue
                if top is not None and top.token is not None and row.token < top.token:
                    self.violate(
                        "stale write accepted", resource,
                        f"write {row.write_id} with token {row.token} committed at seq {row.seq} "
                        f"after write {top.write_id} with token {top.token} (seq {top.seq}): "
                        "the fence let an earlier holder overwrite the newer holder's value "
                        "(a lost update)", self._t(row), row.seq,
                    )  # fmt: skip
                    continue
                if top is None or top.token is None or row.token >= top.token:
                    top = row
                # Sent after a newer lease was granted on its resource, and committed.
                inv = self.invokes.get(row.write_id)
                if inv is None:
                    continue
                times, highs = grant_t.get(resource, ([], []))
                i = bisect.bisect_left(times, float(inv["t"]))
                if i == 0 or highs[i - 1] <= row.token:
                    continue
                newest = highs[i - 1]
                if self.lease_bound:
                    self.violate(
                        "write accepted after a newer grant", resource,
                        f"write {row.write_id} with token {row.token}, sent after token "
                        f"{newest} was granted, was committed at seq {row.seq} under a "
                        "lease-bound fence", self._t(row), row.seq,
                    )  # fmt: skip
                else:
                    self.r.gap_writes += 1

    def lost_updates(self) -> None:
        """A committed write whose read missed its predecessor overwrote it: a lost update."""
        for resource, rows in self.by_resource.items():
            prev: LogRow | None = None
            for row in rows:
                before, prev = prev, row
                if before is None or row.observed == before.value:
                    continue
                self.r.overlaps += 1
                w, p = row.token, before.token
                if w is not None and p is not None and w < p:
                    continue  # reported as a stale write accepted
                if w is not None and p is not None and w > p and not self.lease_bound:
                    self.r.gap_lost_updates += 1
                    continue
                why = (
                    "under a lease-bound fence"
                    if w is not None and p is not None and w > p
                    else "with equal tokens (two holders shared one token)"
                    if w is not None and w == p
                    else "by an unfenced write"
                )
                self.violate(
                    "lost update", resource,
                    f"write {before.write_id} (token {p}, seq {before.seq}) was overwritten by "
                    f"write {row.write_id} (token {w}, seq {row.seq}), which read "
                    f"{row.observed} before it: lost {why}", self._t(row), row.seq,
                )  # fmt: skip

    def rejections(self) -> None:
        committed: dict[str, set[int]] = defaultdict(set)
        for row in self.log:
            if row.token is not None:
                committed[row.resource].add(row.token)
        for wid, out in self.outcomes.items():
            reason = out.get("reason")
            if out["type"] != "fail" or reason not in FENCE_REASONS:
                continue
            inv = self.invokes.get(wid)
            if inv is None:
                continue
            res, token, fence = str(inv["resource"]), inv.get("token"), out.get("fence")
            ok = False
            if reason == "missing":
                ok = token is None
            elif reason == "stale":
                ok = token is not None and fence is not None and fence > token
                ok = ok and (fence in committed[res] or not self.r.final_state)
            elif reason == "lease_mismatch":
                ok = token is not None and (fence is None or fence != token)
            elif reason == "reused":
                ok = token is not None and fence is not None and fence >= token
            elif reason == "malformed":
                ok = True
            if not ok:
                self.violate(
                    "unjustified rejection", res,
                    f"write {wid} (token {token}) was rejected as {reason} (fence {fence}), "
                    "which the history does not support", out["t"], None,
                )  # fmt: skip

    def replay(self) -> None:
        for res in sorted(set(self.register) | set(self.by_resource)):
            rows = self.by_resource.get(res, [])
            if [row.seq for row in rows] != list(range(1, len(rows) + 1)):
                self.violate(
                    "final state differs from replay", res,
                    f"commit sequence of {res} is not 1..{len(rows)}", None, None,
                )  # fmt: skip
            value, count = self.register.get(res, (0, 0))
            expect = rows[-1].value if rows else 0
            if (value, count) != (expect, len(rows)):
                self.violate(
                    "final state differs from replay", res,
                    f"register {res} holds value {value} after {count} writes; replaying the "
                    f"{len(rows)} committed writes gives {expect}",
                    None, rows[-1].seq if rows else None,
                )  # fmt: skip

    def stale_attempts(self) -> None:
        """Stale writes rejected, and certainly stale writes (sent after a write with a higher
        token on their resource was acknowledged) that neither committed nor were rejected."""
        acked: dict[str, list[tuple[float, int]]] = defaultdict(list)
        for wid, out in self.outcomes.items():
            inv = self.invokes.get(wid)
            if out["type"] == "ok" and inv is not None and inv.get("token") is not None:
                acked[str(inv["resource"])].append((float(out["t"]), int(inv["token"])))
        for lst in acked.values():
            lst.sort()
        best: dict[str, list[int]] = {}
        for res, lst in acked.items():
            run, highs = 0, []
            for _, tok in lst:
                run = max(run, tok)
                highs.append(run)
            best[res] = highs
        for wid, inv in self.invokes.items():
            res_out = self.outcomes.get(wid)
            if res_out is not None and res_out.get("reason") in STALE_REASONS:
                self.r.stale_rejected += 1
                continue
            token = inv.get("token")
            if token is None or wid in self.log_by_id:
                continue  # committed: judged by the token order above
            lst = acked.get(str(inv["resource"]), [])
            i = bisect.bisect_left(lst, (float(inv["t"]), -1))
            if i > 0 and best[str(inv["resource"])][i - 1] > token:
                self.r.stale_other += 1


def check(
    events: list[Event],
    log: list[LogRow] | None = None,
    register: dict[str, tuple[int, int]] | None = None,
    *,
    scope: str | None = None,
    issuer: str | None = None,
    lease_bound: bool | None = None,
) -> Report:
    """Check a history; ``log`` / ``register`` add the final state when the history lacks it.

    ``scope`` and ``issuer`` default to the history's ``run`` event (else key, postgres).
    """
    if log is not None or register is not None:
        events = [*events, *final_state_events(log or [], register or {})]
    if lease_bound is not None and scope is None:
        scope = "lease-bound" if lease_bound else None
    try:
        return _Checker(events, scope, issuer).run()
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, HistoryError):
            raise
        raise HistoryError(f"malformed history event: {type(exc).__name__}: {exc}") from exc


def _sent(e: Event) -> float:
    """When a request was sent (``t0``), else when it was recorded."""
    t0 = e.get("t0")
    return float(t0 if t0 is not None else e["t"])


def _fmt_event(e: Event, invokes: dict[str, Event]) -> str:
    kind = e["type"]
    head = f"    {float(e['t']) % 1000:8.3f} {e.get('p', '')!s:<10} {kind:<8}"
    if kind == "acquire":
        return f"{head} lease {e['resource']} token {e['token']} holder {e.get('holder')}"
    if kind == "invoke":
        return (
            f"{head} {e['id']} {e['resource']} token {e.get('token')} "
            f"read {e.get('observed')} -> write {e.get('value')}"
        )
    if kind in ("ok", "fail", "info"):
        extra = {k: v for k, v in e.items() if k not in ("t", "p", "n", "type", "id")}
        inv = invokes.get(str(e["id"]))
        return f"{head} {e['id']} (token {inv and inv.get('token')}) {extra}"
    if kind == "log":
        return f"{head} {e.get('logger')} [{e.get('thread')}] {e.get('msg')}"
    extra = {k: v for k, v in e.items() if k not in ("t", "p", "n", "type")}
    return f"{head} {extra}"


def _is_connection_error(reason: str) -> bool:
    """A failed write that reached no verdict (connection lost before COMMIT, another error):
    counted apart from the fence's rejections."""
    return reason == "connection" or reason.startswith("error:")


def format_report(r: Report, *, max_violations: int = 5) -> str:
    fence = {k: v for k, v in r.rejected.items() if not _is_connection_error(k)}
    errors = {k: v for k, v in r.rejected.items() if _is_connection_error(k)}
    rej = ", ".join(f"{k} {v}" for k, v in sorted(fence.items())) or "none"
    err = ", ".join(f"{k} {v}" for k, v in sorted(errors.items())) or "none"
    contract = contract_for(r.issuer, r.issuer_version)
    lease_kinds = ("duplicate token", "reused token", "token went down", "lease overlap")
    lease_bad = ", ".join(f"{k} {r.count(k)}" for k in lease_kinds)
    gap = (
        f"{r.gap_lost_updates} lost updates, {r.gap_writes} writes in the gap (not a "
        f"violation in {r.scope} scope: {GAP_CLOSES})"
        if r.scope != "lease-bound"
        else "closed by the lease-bound fence (any such write is a violation above)"
    )
    rows = [
        ("issuer", f"{r.issuer}{' ' + r.issuer_version if r.issuer_version else ''}: "
                   f"{contract.exclusion}; tokens: {contract.tokens}"),
        ("lease grants / handovers", f"{r.grants} / {r.handovers}"),
        ("lease safety", lease_bad + (f"; {r.clock_overlaps} overlaps while a clock the "
                                      "contract depends on was faulted (allowed)"
                                      if r.clock_overlaps else "")),
        ("writes attempted", f"{r.writes}"),
        ("  acknowledged", f"{r.acknowledged}"),
        ("  rejected", f"{sum(fence.values())} ({rej})"),
        ("  connection errors", f"{sum(errors.values())} ({err}; no verdict, not rejections)"),
        ("  indeterminate", f"{r.unknown} ({r.unknown_applied} committed, "
                            f"{r.unknown - r.unknown_applied} not)"),
        ("  unfenced (no token)", f"{r.unfenced_attempts}"),
        ("stale writes attempted", f"{r.stale_attempted} ({r.stale_rejected} rejected, "
                                   f"{r.stale_accepted} accepted, "
                                   f"{r.stale_other} lost to a fault first)"),
        ("lost updates (violations)", f"{r.lost_updates}"),
        (GAP, gap),
        ("faults", f"{r.pauses} pauses, {r.kills} kills, {r.crashes} crashes "
                   f"({r.acked_before_crash} writes acked before the last), "
                   f"{r.bouncer_restarts} pgbouncer restarts, {r.clock_faults} clock, "
                   f"{r.net_faults} network, {r.node_faults} issuer-node faults"),
        ("violations", f"{len(r.violations)}"),
    ]  # fmt: skip
    if not r.final_state:
        rows.append(("final state", "MISSING: durability and the fence were not checked"))
    width = max(len(k) for k, _ in rows)
    out = [f"  {k:<{width}}  {v}" for k, v in rows]
    out.append(f"  clocks: {CLOCK_NOTE}")
    if r.violations:
        kinds = Counter(v.kind for v in r.violations)
        out.append("")
        out.append("VIOLATIONS: " + ", ".join(f"{k} x{n}" for k, n in kinds.most_common()))
        shown: Counter[str] = Counter()
        for v in r.violations:
            if shown[v.kind] >= max_violations:
                continue
            shown[v.kind] += 1
            out.append(f"- {v.kind} on {v.resource}: {v.message}")
            out.extend(v.context)
        hidden = len(r.violations) - sum(shown.values())
        if hidden:
            out.append(f"  ... and {hidden} more")
    return "\n".join(out)
