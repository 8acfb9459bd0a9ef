"""The checker on hand-made histories of broken systems: each must fail with its named violation.

A checker that cannot fail proves nothing. Every history starts from one consistent history
(which passes) and breaks one thing: the issuer (duplicate, reused, falling tokens, two holders
at once), the fence (switched off mid-run, an unfenced write), the database (an acknowledged
write lost, a failed write applied), or the read-modify-write (lost updates, classified).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fencekit.chaos.checker import KINDS, LogRow, check, final_state_events, format_report
from fencekit.chaos.history import load_history
from fencekit.cli import main
from fencekit.errors import HistoryError

_n = 0


def ev(t: float, p: str, type_: str, **data: Any) -> dict[str, Any]:
    global _n
    _n += 1
    return {"t": t, "p": p, "n": _n, "type": type_, **data}


def grant(t: float, p: str, token: int, holder: str, ttl: float = 0.5, resource: str = "r0"):
    return ev(t, p, "acquire", resource=resource, token=token, holder=holder, t0=t - 0.01,
              ttl=ttl, issuer="postgres")  # fmt: skip


def write(t: float, p: str, wid: str, token: int | None, observed: int, outcome: str, **o: Any):
    """invoke + outcome events of one write on resource r0."""
    out = [ev(t, p, "invoke", id=wid, resource="r0", token=token, observed=observed,
              value=observed + 1)]  # fmt: skip
    if outcome:
        out.append(ev(t + 0.01, p, outcome, id=wid, **o))
    return out


def good_history() -> tuple[list[dict[str, Any]], list[LogRow], dict[str, tuple[int, int]]]:
    """w0 holds token 1, is paused past its lease; w1 takes token 2 and writes; w0's stale
    write is rejected; an unfenced write is rejected; a crash leaves one write indeterminate
    but committed, and a kill one indeterminate and not committed."""
    events = [
        ev(0.0, "nemesis", "run", scope="key", issuer="postgres", fence=True),
        grant(0.0, "w0", 1, "w0#a"),
        *write(0.1, "w0", "a", 1, 0, "ok", seq=1),
        ev(0.15, "w0", "renew", resource="r0", holder="w0#a", t0=0.15),
        ev(0.2, "nemesis", "pause", worker="w0"),
        grant(0.9, "w1", 2, "w1#b"),
        *write(1.0, "w1", "b", 2, 1, "ok", seq=2),
        ev(1.1, "nemesis", "resume", worker="w0"),
        *write(1.2, "w0", "c", 1, 1, "fail", reason="stale", fence=2),
        *write(1.3, "w1", "d", None, 2, "fail", reason="missing"),
        ev(1.4, "nemesis", "crash"),
        *write(1.5, "w1", "e", 2, 2, "info", error="connection lost"),  # committed after all
        *write(1.6, "w1", "f", 2, 3, ""),  # killed: no outcome, not committed
        ev(1.7, "nemesis", "kill", worker="w1"),
        grant(2.5, "w2", 3, "w2#c"),
        *write(2.6, "w2", "g", 3, 3, "ok", seq=4),
        ev(2.7, "w2", "release", resource="r0", holder="w2#c", t0=2.7),
    ]
    log = [
        LogRow("r0", 1, 1, 1, 0, "a"),
        LogRow("r0", 2, 2, 2, 1, "b"),
        LogRow("r0", 3, 2, 3, 2, "e"),
        LogRow("r0", 4, 3, 4, 3, "g"),
    ]
    return events, log, {"r0": (4, 4)}


def kinds(report) -> set[str]:
    return {v.kind for v in report.violations}


def assert_summary_agrees(report) -> None:
    """The summary's figures are the violation list's: they cannot disagree."""
    d = report.as_dict()
    assert d["violations"] == len(report.violations)
    assert sum(d["violations_by_kind"].values()) == len(report.violations)
    assert d["stale_accepted"] == report.count("stale write accepted") + report.count(
        "write accepted after a newer grant"
    )
    assert d["lost_updates"] == report.count("lost update") + report.count("stale write accepted")
    text = format_report(report)
    assert f"violations                 {len(report.violations)}" in text
    for kind, n in d["violations_by_kind"].items():
        assert f"{kind} x{n}" in text


def test_a_consistent_history_passes_and_is_counted() -> None:
    events, log, register = good_history()
    r = check(events, log, register)
    assert r.violations == [], format_report(r)
    assert (r.writes, r.acknowledged, r.unknown, r.unknown_applied) == (7, 3, 2, 1)
    assert dict(r.rejected) == {"stale": 1, "missing": 1}
    assert (r.stale_attempted, r.stale_rejected, r.stale_accepted) == (1, 1, 0)
    assert (r.pauses, r.kills, r.crashes, r.grants, r.handovers) == (1, 1, 1, 3, 2)
    assert r.acked_before_crash == 2
    assert_summary_agrees(r)


# ---------------------------------------------------------------- broken issuers


def test_duplicate_token() -> None:
    events, log, register = good_history()
    events.append(grant(0.3, "w3", 1, "w3#x"))  # w0 (token 1) is still live
    r = check(events, log, register)
    assert kinds(r) == {"duplicate token", "lease overlap"}, format_report(r)
    assert_summary_agrees(r)


def test_reused_token() -> None:
    events, log, register = good_history()
    events.append(grant(3.0, "w3", 3, "w3#x"))  # w2 released token 3 at 2.7
    r = check(events, log, register)
    assert kinds(r) == {"reused token"}, format_report(r)


def test_token_going_down() -> None:
    events, log, register = good_history()
    events.append(grant(3.5, "w3", 2, "w3#x"))  # after token 3 was granted and released
    r = check(events, log, register)
    assert "token went down" in kinds(r), format_report(r)
    assert "lease overlap" not in kinds(r)


def test_two_overlapping_holders() -> None:
    events, log, register = good_history()
    events.append(grant(0.3, "w3", 5, "w3#x"))  # token rises, but w0's lease runs to 0.64
    r = check(events, log, register)
    assert "lease overlap" in kinds(r), format_report(r)
    overlap = next(v for v in r.violations if v.kind == "lease overlap")
    assert "w3#x" in overlap.message
    assert "w0#a" in overlap.message


def test_the_issuers_own_diagnostics_explain_an_overlap_and_change_no_verdict() -> None:
    """``loss`` and ``log`` events (the issuer's loss signal and its client's log) are not
    judged; an overlap's context shows the log lines of the processes on its resource only."""
    events, log, register = good_history()
    kazoo = {"logger": "kazoo.client", "level": "INFO", "thread": "conn"}
    diagnostics = [
        ev(0.25, "w0", "log", msg="Zookeeper connection lost", **kazoo),
        ev(0.26, "w0", "loss", resource="r0", holder="w0#a", token=1, reason="cut off"),
        ev(0.27, "w9", "log", msg="somebody else's connection", **kazoo),
    ]
    clean = check(events + diagnostics, log, register)
    assert clean.violations == [], format_report(clean)
    assert clean.as_dict() == check(events, log, register).as_dict()
    events.append(grant(0.3, "w3", 5, "w3#x"))  # w0's lease runs to 0.64
    r = check(events + diagnostics, log, register)
    overlap = next(v for v in r.violations if v.kind == "lease overlap")
    text = "\n".join(overlap.context)
    assert "kazoo.client [conn] Zookeeper connection lost" in text
    assert "'reason': 'cut off'" in text
    assert "somebody else's connection" not in text


def test_overlap_allowed_by_the_contract_only_while_its_clock_is_faulted() -> None:
    events, log, register = good_history()
    events += [
        ev(0.25, "nemesis", "clock", target="server", fault="step forward", spec="+3"),
        grant(0.3, "w3", 5, "w3#x"),
        ev(0.4, "nemesis", "clock", target="server", fault=None, spec="+0"),
    ]
    r = check(events, log, register)
    assert "lease overlap" not in kinds(r), format_report(r)
    assert r.clock_overlaps == 1
    # etcd's leases do not depend on the PostgreSQL server's clock: the same overlap fails.
    assert "lease overlap" in kinds(check(events, log, register, issuer="etcd"))
    # A fault on the workers' clocks excuses nothing.
    events = [{**e, "target": "workers"} if e["type"] == "clock" else e for e in events]
    assert "lease overlap" in kinds(check(events, log, register))


def test_old_etcd_may_end_a_lease_while_a_member_is_paused_and_no_other_does() -> None:
    """etcd before 3.4.31 / 3.5.13 lets a deposed leader revoke leases as it resumes
    (etcd-io/etcd#15247): the contract of those versions counts a paused member as a fault of
    etcd's clock, until a second after it resumes. A kill, a later grant and a fixed
    etcd excuse nothing."""
    events, log, register = good_history()
    run = next(e for e in events if e["type"] == "run")

    def with_etcd(version: str | None, *faults: dict[str, Any]) -> list[dict[str, Any]]:
        return [{**e, "issuer": "etcd", "issuer_version": version} if e is run else e
                for e in events] + [*faults, grant(0.3, "w3", 5, "w3#x")]  # fmt: skip

    pause = [ev(0.1, "nemesis", "node", fault="member paused (SIGSTOP)", node="e1", pause=True),
             ev(0.25, "nemesis", "node", fault=None, action="resumed", node="e1")]  # fmt: skip
    r = check(with_etcd("3.4.23", *pause), log, register)
    assert "lease overlap" not in kinds(r), format_report(r)
    assert r.clock_overlaps == 1
    assert r.issuer_version == "3.4.23"
    assert "etcd 3.4.23: " in format_report(r)
    assert "etcd-io/etcd#15247" in format_report(r)
    for version in ("3.4.31", "3.5.13", "3.6.0", None, "not a version"):
        assert "lease overlap" in kinds(check(with_etcd(version, *pause), log, register))
    kill = [{**pause[0], "fault": "leader killed (SIGKILL)", "pause": None}, pause[1]]
    assert "lease overlap" in kinds(check(with_etcd("3.4.23", *kill), log, register))
    # The allowance is old etcd's alone: the same history under another issuer's contract
    # (a ZooKeeper or PostgreSQL history that claims a version, or a pause) excuses nothing.
    for other in ("zookeeper", "postgres", "someone-elses"):
        forged = [{**e, "issuer": other} if e["type"] == "run" else e
                  for e in with_etcd("3.4.23", *pause)]  # fmt: skip
        assert "lease overlap" in kinds(check(forged, log, register)), other
    # The window ends a second after the resume: an overlap that begins later is a violation.
    late = [{**pause[0], "t": -1.9}, {**pause[1], "t": -1.8}]
    assert "lease overlap" in kinds(check(with_etcd("3.4.23", *late), log, register))


# ---------------------------------------------------------------- broken fences


def test_fence_switched_off_mid_run() -> None:
    """Someone unprotects the table: w0's stale write (token 1) lands after token 2's."""
    events, log, _ = good_history()
    events = [e for e in events if e.get("id") != "c"]
    events += [
        ev(1.15, "dba", "unprotect", table="chaos_register"),
        *write(1.2, "w0", "c", 1, 1, "ok", seq=5),
    ]
    r = check(events, [*log, LogRow("r0", 5, 1, 2, 1, "c")], {"r0": (2, 5)})
    assert "stale write accepted" in kinds(r), format_report(r)
    assert r.stale_accepted == r.count("stale write accepted") == 1
    assert r.lost_updates >= 1
    assert "lost update" in format_report(r)
    assert_summary_agrees(r)


def test_unfenced_write_accepted() -> None:
    events, log, _ = good_history()
    events = [e for e in events if e.get("id") != "d"]
    events += write(2.8, "w1", "d", None, 4, "ok", seq=5)
    r = check(events, [*log, LogRow("r0", 5, None, 5, 4, "d")], {"r0": (5, 5)})
    assert kinds(r) == {"unfenced write accepted"}


# ---------------------------------------------------------------- broken databases


def test_acknowledged_write_lost() -> None:
    events, log, _ = good_history()
    r = check(events, [log[0], *log[2:]], {"r0": (4, 3)})
    assert "acknowledged write lost" in kinds(r), format_report(r)


def test_failed_write_applied() -> None:
    events, log, _ = good_history()
    r = check(events, [*log, LogRow("r0", 5, 1, 2, 1, "c")], {"r0": (2, 5)})
    assert "failed write applied" in kinds(r), format_report(r)


def test_unjustified_rejections() -> None:
    events, log, register = good_history()
    events += write(3.0, "w2", "h", 3, 4, "fail", reason="stale", fence=7)  # no such fence
    events += write(3.1, "w2", "i", 3, 4, "fail", reason="missing")  # it had a token
    r = check(events, log, register)
    assert [v.kind for v in r.violations] == ["unjustified rejection"] * 2


def test_final_state_differs_from_replay() -> None:
    events, log, _ = good_history()
    assert kinds(check(events, log, {"r0": (99, 4)})) == {"final state differs from replay"}


def test_phantom_and_misplaced_writes() -> None:
    events, log, register = good_history()
    log = [LogRow("r0", 1, 1, 1, 0, "a"), LogRow("r0", 2, 2, 2, 1, "zz"),
           LogRow("r0", 3, 2, 3, 2, "b"), LogRow("r0", 4, 3, 4, 3, "g")]  # fmt: skip
    r = check(events, log, register)
    assert {"phantom write", "acknowledged at another position"} <= kinds(r)


# ---------------------------------------------------------------- lost updates, classified


def _gap_history():
    """w1 (token 2) reads 1; w0 (token 1, paused past its lease) writes 1->2 before w1's first
    write, so its token is not stale yet; w1 writes 2 over it: w0's update is lost."""
    events, log, _ = good_history()
    events = [e for e in events if e.get("id") not in ("b", "c", "e", "f", "g")]
    events += [
        *write(1.0, "w0", "c", 1, 1, "ok", seq=2),
        *write(1.05, "w1", "b", 2, 1, "ok", seq=3),
    ]
    log = [LogRow("r0", 1, 1, 1, 0, "a"), LogRow("r0", 2, 1, 2, 1, "c"),
           LogRow("r0", 3, 2, 2, 1, "b")]  # fmt: skip
    return events, log, {"r0": (2, 3)}


def test_grant_to_first_write_gap_is_named_and_counted_not_ok() -> None:
    r = check(*_gap_history())
    assert r.violations == [], format_report(r)
    assert (r.gap_lost_updates, r.gap_writes, r.overlaps) == (1, 1, 1)
    text = format_report(r)
    assert "grant-to-first-write gap   1 lost updates" in text
    assert "lease-bound" in text
    assert "compare-and-set" in text


def test_lost_update_is_a_violation_under_lease_bound_fences() -> None:
    r = check(*_gap_history(), scope="lease-bound")
    assert kinds(r) == {"lost update", "write accepted after a newer grant"}, format_report(r)
    assert r.lost_updates == 1
    assert r.gap_lost_updates == 0
    assert_summary_agrees(r)


def test_lost_update_with_a_shared_token_is_a_violation_in_any_scope() -> None:
    events, log, register = _gap_history()
    events.append(grant(0.95, "w3", 2, "w3#x"))
    log[1] = LogRow("r0", 2, 2, 2, 1, "c")
    for e in events:
        if e.get("id") == "c" and e["type"] == "invoke":
            e["token"] = 2
    r = check(events, log, register)
    assert {"lost update", "duplicate token"} <= kinds(r), format_report(r)


# ---------------------------------------------------------------- indeterminate writes


def test_indeterminate_writes_are_neither_lost_nor_applied_unless_observed() -> None:
    events, log, register = good_history()
    r = check(events, log, register)
    assert r.violations == []
    assert (r.unknown, r.unknown_applied) == (2, 1)
    # An indeterminate write that the final state shows committed is judged like any other:
    # here a stale one (token 1 after token 3), so the fence failed.
    events += write(3.0, "w0", "j", 1, 4, "info", error="timeout")
    r = check(events, [*log, LogRow("r0", 5, 1, 5, 4, "j")], {"r0": (5, 5)})
    assert kinds(r) == {"stale write accepted"}


# ---------------------------------------------------------------- saved histories and the CLI


def _save(tmp_path: Path, events, log, register) -> Path:
    path = tmp_path / "history.jsonl"
    path.write_text(
        "".join(json.dumps(e) + "\n" for e in [*events, *final_state_events(log, register)])
    )
    return path


def test_check_command_on_saved_histories(tmp_path: Path, capsys) -> None:
    path = _save(tmp_path, *good_history())
    assert load_history(path)[0]["type"] == "run"
    assert main(["chaos", "check", str(path), "--json"]) == 0
    out = capsys.readouterr().out
    assert "OK: no violation" in out
    assert json.loads(out.strip().splitlines()[-1])["violations"] == 0

    events, log, register = good_history()
    events.append(grant(0.3, "w3", 1, "w3#x"))
    bad = _save(tmp_path, events, log, register)
    assert main(["chaos", "check", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "VIOLATIONS:" in out
    assert "duplicate token x1" in out
    assert "FAILED" in out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        ("", "no events"),
        ('{"t": 1, "type": "invoke"}\n', "needs id, resource"),
        ("not json\n{}\n", ":1: not a JSON object"),
        ("[1, 2]\n", "not a JSON object"),
        ('{"type": "ok", "id": "a"}\n', "a number 't'"),
    ],
)
def test_check_command_refuses_bad_input(tmp_path: Path, capsys, content, message) -> None:
    path = tmp_path / "h.jsonl"
    if content is not None:
        path.write_text(content)
    assert main(["chaos", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "fencekit chaos check: error:" in err, err
    assert message in err, err


def test_a_torn_last_line_is_forgiven(tmp_path: Path) -> None:
    path = _save(tmp_path, *good_history())
    whole = len(load_history(path))
    path.write_text(path.read_text() + '{"t": 9, "type": "inv')
    assert len(load_history(path)) == whole
    path.write_text(path.read_text() + '\n{"t": 9}\n')  # torn, then more: not forgiven
    with pytest.raises(HistoryError, match="not a JSON object"):
        load_history(path)
    with pytest.raises(HistoryError):
        load_history(tmp_path / "missing.jsonl")


def test_check_help(capsys) -> None:
    assert main(["chaos", "check", "--help"]) == 0
    out = capsys.readouterr().out
    assert "HISTORY" in out
    assert "Exit status" in out


def test_html_report_is_one_self_contained_file(tmp_path: Path) -> None:
    from fencekit.chaos.report import write_html  # plotly: in the test extra (via chaos)

    events, log, register = good_history()
    events.append(grant(0.3, "w3", 1, "w3#x"))
    all_events = [*events, *final_state_events(log, register)]
    r = check(all_events)
    html = tmp_path / "run.html"
    write_html(all_events, r, html, title="broken")
    text = html.read_text()
    assert "<script src=" not in text  # plotly's JS is inlined, nothing fetched
    assert "Plotly.newPlot" in text or "plotly" in text.lower()
    assert "duplicate token" in text
    assert "VIOLATION" in text
    assert "lease: w0" in text
    assert "write rejected" in text


def test_every_kind_has_a_test() -> None:
    """Each violation kind appears in this file's assertions (a kind that nothing can trip
    would be a check that cannot fail)."""
    source = Path(__file__).read_text()
    assert [k for k in KINDS if f'"{k}"' not in source] == []


def test_the_documented_history_example_passes(tmp_path: Path, capsys) -> None:
    """docs/chaos.md's minimal history is a valid history that passes; with its indeterminate
    stale write committed after all, it fails as the doc says."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "chaos.md").read_text()
    block = doc.split("```jsonl\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "doc.jsonl"
    path.write_text(block)
    assert main(["chaos", "check", str(path)]) == 0, capsys.readouterr().out
    assert "OK: no violation" in capsys.readouterr().out
    events = [json.loads(line) for line in block.splitlines()]
    events = [e for e in events if e["type"] != "register"]
    events += [
        *write(2.1, "w1", "c", 8, 1, "ok", seq=2),
        {"t": 3.0, "p": "final", "type": "committed", "resource": "r0", "seq": 2, "token": 8,
         "value": 2, "observed": 1, "id": "c"},
        {"t": 3.0, "p": "final", "type": "committed", "resource": "r0", "seq": 3, "token": 7,
         "value": 2, "observed": 1, "id": "b"},
        {"t": 3.0, "p": "final", "type": "register", "resource": "r0", "value": 2, "count": 3},
    ]  # fmt: skip
    r = check(events)
    assert kinds(r) == {"stale write accepted"}, format_report(r)


def test_a_history_without_its_final_state_checks_the_leases_and_says_so(tmp_path: Path) -> None:
    events, _, _ = good_history()
    r = check(events)
    assert r.final_state is False
    assert r.violations == []
    assert "MISSING: durability and the fence were not checked" in format_report(r)
    events.append(grant(0.3, "w3", 1, "w3#x"))
    assert "duplicate token" in kinds(check(events))
