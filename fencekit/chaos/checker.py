"""Check a chaos history against the database's final state.

Inputs: the merged history (see :mod:`fencekit.chaos.history`), the rows of ``chaos_log``
(every committed write, with its per-resource commit sequence) and of ``chaos_register`` (the
final value per resource), read after the last crash recovery.

Invariants (a failure of any one is a violation, printed with the events around it):

1. Every acknowledged write is committed, at the sequence number its client was told: nothing
   acknowledged is lost, even across an immediate shutdown.
2. Nothing committed was reported as rejected or not applied, and nothing committed was never
   attempted. Unknown outcomes (connection lost during COMMIT, worker killed mid-write) may or
   may not have applied: the log says which, and both are counted.
3. In commit order, no committed write on a resource carries a token lower than an earlier one
   (a stale write accepted: it overwrote a newer holder's value, a lost update), and none
   carries no token at all (an unfenced write accepted).
4. Every rejection was justified: ``stale`` names a fence above the token that some committed
   write did carry; ``missing`` means the write had no token; ``lease_mismatch`` names a live
   lease token above the token, or none.
5. The final state equals replaying the committed writes in order: sequence numbers are 1..n
   with n the register's count, and the register holds the last write's value.

Read-modify-write overlaps (a write whose observed value is not its predecessor's value) are
counted; with plain fences they are the window DESIGN.md's lease-bound fences close (an old
holder writing after a new grant but before the new holder's first write), so they are a
violation only when the run used lease-bound fences.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from fencekit.chaos.history import Event

__all__ = ["LogRow", "Report", "Violation", "check", "format_report"]

FENCE_REASONS = ("stale", "missing", "lease_mismatch", "reused", "malformed")


@dataclass(frozen=True)
class LogRow:
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
class Report:
    writes: int = 0
    acknowledged: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    unknown: int = 0
    unknown_applied: int = 0
    unfenced_attempts: int = 0
    stale_attempted: int = 0
    stale_rejected: int = 0
    stale_other: int = 0  # stale attempts that failed otherwise (connection lost, killed)
    stale_accepted: int = 0
    overlaps: int = 0
    grants: int = 0
    handovers: int = 0
    pauses: int = 0
    kills: int = 0
    crashes: int = 0
    bouncer_restarts: int = 0
    acked_before_crash: int = 0
    violations: list[Violation] = field(default_factory=list)

    @property
    def lost_updates(self) -> int:
        return sum(1 for v in self.violations if v.kind == "stale write accepted")

    def as_dict(self) -> dict[str, Any]:
        return {
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
            "overlaps": self.overlaps,
            "grants": self.grants,
            "handovers": self.handovers,
            "pauses": self.pauses,
            "kills": self.kills,
            "crashes": self.crashes,
            "bouncer_restarts": self.bouncer_restarts,
            "acked_before_crash": self.acked_before_crash,
            "violations": len(self.violations),
            "violations_by_kind": dict(Counter(v.kind for v in self.violations)),
        }


class _Checker:
    def __init__(
        self,
        events: list[Event],
        log: list[LogRow],
        register: dict[str, tuple[int, int]],
        lease_bound: bool,
    ) -> None:
        self.events = events
        self.log = log
        self.register = register
        self.lease_bound = lease_bound
        self.r = Report()
        self.invokes: dict[str, Event] = {}
        self.outcomes: dict[str, Event] = {}
        for e in events:
            if e["type"] == "invoke":
                self.invokes[e["id"]] = e
            elif e["type"] in ("ok", "fail", "info"):
                self.outcomes[e["id"]] = e
        self.log_by_id = {row.write_id: row for row in log}
        self.by_resource: dict[str, list[LogRow]] = defaultdict(list)
        for row in sorted(log, key=lambda x: (x.resource, x.seq)):
            self.by_resource[row.resource].append(row)

    def violate(
        self, kind: str, resource: str | None, message: str, t: float | None, seq: int | None
    ) -> None:
        self.r.violations.append(
            Violation(kind, resource, message, t, seq, self.around(resource, t, seq))
        )

    def around(self, resource: str | None, t: float | None, seq: int | None) -> list[str]:
        """History lines near ``t`` on ``resource`` (and nemesis actions), and nearby log rows."""
        lines: list[str] = []
        if t is not None:
            near = [
                e
                for e in self.events
                if t - 2.0 <= e["t"] <= t + 0.5
                and (e.get("resource") in (None, resource) or self._resource_of(e) == resource)
                and not (e["type"] in ("ok", "fail", "info") and self._resource_of(e) != resource)
            ]
            lines += [_fmt_event(e, self.invokes) for e in near[-14:]]
        if resource is not None and seq is not None:
            rows = self.by_resource.get(resource, [])
            lines += [
                f"    log {row.resource} seq={row.seq} token={row.token} observed={row.observed} "
                f"value={row.value} id={row.write_id}"
                for row in rows
                if seq - 3 <= row.seq <= seq + 1
            ]
        return lines

    def _resource_of(self, e: Event) -> str | None:
        if "resource" in e:
            return str(e["resource"])
        inv = self.invokes.get(e.get("id", ""))
        return None if inv is None else str(inv["resource"])

    def run(self) -> Report:
        self.nemesis_and_grants()
        self.outcome_counts()
        self.durability()
        self.token_order()
        self.rejections()
        self.replay()
        self.stale_attempts()
        return self.r

    def nemesis_and_grants(self) -> None:
        kinds = Counter(e["type"] for e in self.events)
        self.r.pauses, self.r.kills = kinds["pause"], kinds["kill"]
        self.r.crashes, self.r.bouncer_restarts = kinds["crash"], kinds["bouncer"]
        grants: dict[str, list[Event]] = defaultdict(list)
        for e in self.events:
            if e["type"] == "acquire":
                grants[e["resource"]].append(e)
        for gs in grants.values():
            gs.sort(key=lambda e: e["token"])
            self.r.grants += len(gs)
            self.r.handovers += sum(1 for a, b in itertools.pairwise(gs) if a["p"] != b["p"])

    def outcome_counts(self) -> None:
        r = self.r
        r.writes = len(self.invokes)
        r.unfenced_attempts = sum(1 for e in self.invokes.values() if e["token"] is None)
        for wid in self.invokes:
            out = self.outcomes.get(wid)
            if out is None or out["type"] == "info":
                r.unknown += 1
                r.unknown_applied += wid in self.log_by_id
            elif out["type"] == "ok":
                r.acknowledged += 1
            else:
                r.rejected[str(out.get("reason"))] += 1
        crashes = [e["t"] for e in self.events if e["type"] == "crash"]
        last_crash = max(crashes, default=None)
        if last_crash is not None:
            r.acked_before_crash = sum(
                1 for o in self.outcomes.values() if o["type"] == "ok" and o["t"] < last_crash
            )

    def durability(self) -> None:
        for wid, out in self.outcomes.items():
            inv = self.invokes.get(wid)
            res = None if inv is None else str(inv["resource"])
            row = self.log_by_id.get(wid)
            if out["type"] == "ok":
                if row is None:
                    self.violate(
                        "acknowledged write lost", res,
                        f"write {wid} was acknowledged (seq {out.get('seq')}) but is not in the "
                        "database after recovery", out["t"], out.get("seq"),
                    )  # fmt: skip
                elif row.seq != out.get("seq"):
                    self.violate(
                        "acknowledged at another position", res,
                        f"write {wid} was acknowledged at seq {out.get('seq')} but committed at "
                        f"seq {row.seq}", out["t"], row.seq,
                    )  # fmt: skip
            elif out["type"] == "fail" and row is not None:
                self.violate(
                    "rejected write applied", res,
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

    def _t(self, row: LogRow) -> float | None:
        e = self.outcomes.get(row.write_id) or self.invokes.get(row.write_id)
        return None if e is None else float(e["t"])

    def token_order(self) -> None:
        for resource, rows in self.by_resource.items():
            top: LogRow | None = None
            prev_value = 0
            for row in rows:
                if row.observed != prev_value:
                    self.r.overlaps += 1
                    if self.lease_bound:
                        self.violate(
                            "overlapping read-modify-write", resource,
                            f"write {row.write_id} (token {row.token}) read {row.observed} but "
                            f"committed after a write of {prev_value}", self._t(row), row.seq,
                        )  # fmt: skip
                prev_value = row.value
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
                        "it overwrote the newer holder's value (lost update)",
                        self._t(row), row.seq,
                    )  # fmt: skip
                if top is None or top.token is None or row.token >= top.token:
                    top = row

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
            res, token, fence = str(inv["resource"]), inv["token"], out.get("fence")
            ok = False
            if reason == "missing":
                ok = token is None
            elif reason == "stale":
                ok = token is not None and fence is not None and fence > token
                ok = ok and fence in committed[res]
            elif reason == "lease_mismatch":
                ok = token is not None and (fence is None or fence > token)
            if not ok:
                self.violate(
                    "unjustified rejection", res,
                    f"write {wid} (token {token}) was rejected as {reason} (fence {fence}), "
                    "which the history does not support", out["t"], None,
                )  # fmt: skip

    def replay(self) -> None:
        resources = set(self.register) | set(self.by_resource)
        for res in sorted(resources):
            rows = self.by_resource.get(res, [])
            seqs = [row.seq for row in rows]
            if seqs != list(range(1, len(rows) + 1)):
                self.violate(
                    "final state differs from replay", res,
                    f"commit sequence of {res} is not 1..{len(rows)}", None, None,
                )  # fmt: skip
            value, count = self.register.get(res, (0, 0))
            # Replay: the committed writes in commit order, each setting the register's value.
            expect = rows[-1].value if rows else 0
            if (value, count) != (expect, len(rows)):
                self.violate(
                    "final state differs from replay", res,
                    f"register {res} holds value {value} after {count} writes; replaying the "
                    f"{len(rows)} committed writes gives {expect}",
                    None, rows[-1].seq if rows else None,
                )  # fmt: skip

    def stale_attempts(self) -> None:
        """Stale writes: rejected as stale by the database, or sent after a write with a higher
        token on their resource had been acknowledged (so certainly stale, whatever happened)."""
        acked: dict[str, list[tuple[float, int]]] = defaultdict(list)
        for wid, out in self.outcomes.items():
            inv = self.invokes.get(wid)
            if out["type"] == "ok" and inv is not None and inv["token"] is not None:
                acked[inv["resource"]].append((out["t"], inv["token"]))
        for wid, inv in self.invokes.items():
            if inv["token"] is None:
                continue
            res = self.outcomes.get(wid)
            rejected = res is not None and res.get("reason") in ("stale", "lease_mismatch")
            newer = any(t < inv["t"] and tok > inv["token"] for t, tok in acked[inv["resource"]])
            if not (rejected or newer):
                continue
            self.r.stale_attempted += 1
            if rejected:
                self.r.stale_rejected += 1
            elif res is not None and res["type"] == "ok":
                self.r.stale_accepted += 1
            else:
                self.r.stale_other += 1


def check(
    events: list[Event],
    log: list[LogRow],
    register: dict[str, tuple[int, int]],
    *,
    lease_bound: bool = False,
) -> Report:
    """Check a merged history against the committed log and the final register values."""
    return _Checker(events, log, register, lease_bound).run()


def _fmt_event(e: Event, invokes: dict[str, Event]) -> str:
    kind = e["type"]
    head = f"    {e['t'] % 1000:8.3f} {e['p']:<10} {kind:<8}"
    if kind == "acquire":
        return f"{head} lease {e['resource']} token {e['token']}"
    if kind == "invoke":
        return (
            f"{head} {e['id']} {e['resource']} token {e['token']} "
            f"read {e['observed']} -> write {e['value']}"
        )
    if kind in ("ok", "fail", "info"):
        extra = {k: v for k, v in e.items() if k not in ("t", "p", "n", "type", "id")}
        inv = invokes.get(e["id"], {})
        return f"{head} {e['id']} (token {inv.get('token')}) {extra}"
    extra = {k: v for k, v in e.items() if k not in ("t", "p", "n", "type")}
    return f"{head} {extra}"


def format_report(r: Report, *, max_violations: int = 5) -> str:
    rej = ", ".join(f"{k} {v}" for k, v in sorted(r.rejected.items())) or "none"
    rows = [
        ("writes attempted", f"{r.writes}"),
        ("  acknowledged", f"{r.acknowledged}"),
        ("  rejected", f"{sum(r.rejected.values())} ({rej})"),
        ("  unknown outcome", f"{r.unknown} ({r.unknown_applied} applied, "
                              f"{r.unknown - r.unknown_applied} not)"),
        ("  unfenced (no token)", f"{r.unfenced_attempts}"),
        ("stale writes attempted", f"{r.stale_attempted} ({r.stale_rejected} rejected, "
                                   f"{r.stale_accepted} accepted, "
                                   f"{r.stale_other} lost to a fault first)"),
        ("read-modify-write overlaps", f"{r.overlaps}"),
        ("lease grants / handovers", f"{r.grants} / {r.handovers}"),
        ("pauses (SIGSTOP past ttl)", f"{r.pauses}"),
        ("kills (SIGKILL)", f"{r.kills}"),
        ("crashes (immediate)", f"{r.crashes} ({r.acked_before_crash} writes acked before the "
                                "last one)"),
        ("pgbouncer restarts", f"{r.bouncer_restarts}"),
        ("violations", f"{len(r.violations)}"),
    ]  # fmt: skip
    width = max(len(k) for k, _ in rows)
    out = [f"  {k:<{width}}  {v}" for k, v in rows]
    if r.violations:
        kinds = Counter(v.kind for v in r.violations)
        out.append("")
        out.append("VIOLATIONS: " + ", ".join(f"{k} x{n}" for k, n in kinds.most_common()))
        for v in r.violations[:max_violations]:
            out.append(f"- {v.kind} on {v.resource}: {v.message}")
            out.extend(v.context)
        if len(r.violations) > max_violations:
            out.append(f"  ... and {len(r.violations) - max_violations} more")
    return "\n".join(out)
