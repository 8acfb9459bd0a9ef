"""``--report run.html``: the run as one self-contained HTML timeline (plotly, JS inlined).

One row per resource: who held the lease when (a bar per grant, coloured by worker, from the
grant until its release or its ttl after the last renewal), a hatched bar over a grant while
its worker was paused, each write at the moment it was sent (accepted; rejected, one symbol per
rejection reason; a connection error; indeterminate), and every violation as a black cross with
its message on hover. Below them a row per fault kind, each with its own symbol. The page has
one title, a "how to read this" legend, the counts (connection errors apart from rejections)
and the checker's text, wrapped. Needs the ``chaos`` extra (``pip install 'pg-fencekit[chaos]'``).
"""

from __future__ import annotations

import html
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fencekit.chaos.checker import Report, format_report
from fencekit.chaos.history import Event

__all__ = ["FAULT_SYMBOLS", "write_html"]

_PALETTE = (
    "#4C78A8", "#F58518", "#54A24B", "#B279A2", "#9D755D", "#72B7B2", "#EECA3B", "#FF9DA6",
)  # fmt: skip

#: One marker per fault kind (the nemesis rows).
FAULT_SYMBOLS = {
    "pause": "line-ns-open",
    "kill": "x-thin-open",
    "crash": "star-triangle-down",
    "clock": "circle-cross-open",
    "net": "triangle-right",
    "node": "diamond-tall",
    "bouncer": "square-x-open",
}
#: One marker per rejection reason (fencekit.errors' ``reason`` of each SQLSTATE).
REASON_SYMBOLS = {
    "stale": "x",
    "reused": "cross",
    "missing": "square-open",
    "malformed": "star",
    "bypass_refused": "hourglass",
    "lease_mismatch": "bowtie",
    "issuer_mismatch": "hexagram",
    "usage": "asterisk-open",
}
_OTHER_REASONS = ("triangle-up-open", "pentagon-open", "hexagon-open", "octagon-open")
_CONNECTION = "connection error"  # the write never reached a verdict: not a rejection

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; max-width: 1400px; }
h1 { font-size: 1.4em; margin-bottom: .2em; }
.verdict { font-size: 1.1em; margin-top: 0; }
.verdict.bad { color: #b00; font-weight: bold; }
table.counts td { padding: 0 1em 0 0; }
pre.checker { white-space: pre-wrap; overflow-wrap: anywhere; background: #f6f6f6;
  padding: .8em; border: 1px solid #ddd; }
section.how dt { font-weight: bold; margin-top: .4em; }
"""


@dataclass
class _Points:
    x: list[float] = field(default_factory=list)
    y: list[str] = field(default_factory=list)
    text: list[str] = field(default_factory=list)


@dataclass
class _Bars:
    y: list[str] = field(default_factory=list)
    base: list[float] = field(default_factory=list)
    x: list[float] = field(default_factory=list)
    text: list[str] = field(default_factory=list)

    def add(self, row: str, start: float, end: float, text: str) -> None:
        self.y.append(row)
        self.base.append(start)
        self.x.append(max(0.005, end - start))
        self.text.append(text)


def _worker(process: object) -> str:
    return str(process).split(".", 1)[0]


def _t0(e: Event) -> float:
    t0 = e.get("t0")
    return float(t0 if t0 is not None else e["t"])


def _describe(e: Event) -> str:
    skip = ("t", "p", "n", "type")
    return f"{e['type']}: " + ", ".join(f"{k}={v}" for k, v in e.items() if k not in skip)


def _holds(timed: list[Event]) -> list[tuple[Event, float, float]]:
    """Each grant with its start and end (release, else ttl after the last renewal)."""
    spans: dict[str, list[float]] = {}
    for e in timed:
        holder = str(e.get("holder"))
        if e["type"] == "acquire":
            start = _t0(e)
            spans[holder] = [start, start + float(e.get("ttl", 0))]
        elif e["type"] == "renew" and holder in spans:
            start, end = spans[holder]
            ttl = end - start
            spans[holder][1] = max(end, _t0(e) + ttl)
        elif e["type"] == "release" and holder in spans:
            spans[holder][1] = min(spans[holder][1], _t0(e))
    return [
        (e, *spans[str(e.get("holder"))])  # type: ignore[misc]
        for e in timed
        if e["type"] == "acquire"
    ]


def _pauses(timed: list[Event], end_of_run: float) -> list[tuple[Event, float, float]]:
    """Each pause with its start and end (the resume, else its planned length)."""
    out = []
    for i, e in enumerate(timed):
        if e["type"] != "pause":
            continue
        start = float(e["t"])
        end = start + float(e.get("seconds", 0))
        for later in timed[i + 1 :]:
            if later["type"] == "resume" and later.get("worker") == e.get("worker"):
                end = float(later["t"])
                break
        out.append((e, start, min(end, max(end_of_run, start))))
    return out


def _outcome(out: Event | None, committed: bool) -> tuple[str, str]:
    """(category, label) of a write: accepted, rejected (with its reason), connection error,
    indeterminate."""
    if out is None or out["type"] == "info":
        label = "indeterminate (committed)" if committed else "indeterminate"
        return "indeterminate", label
    if out["type"] == "ok":
        return "accepted", "accepted"
    reason = str(out.get("reason") or "")
    if reason == "connection" or reason.startswith("error:") or not reason:
        return "connection", _CONNECTION
    return "rejected", f"rejected: {reason}"


def write_html(events: list[Event], report: Report, path: Path, *, title: str) -> None:
    try:
        import plotly.graph_objects as go  # type: ignore[import-untyped]
        import plotly.io as pio  # type: ignore[import-untyped]
    except ImportError as exc:
        raise RuntimeError("--report needs plotly: pip install 'pg-fencekit[chaos]'") from exc
    timed = sorted(
        (e for e in events if e.get("type") not in ("committed", "register")),
        key=lambda e: float(e["t"]),
    )
    t0 = min((float(e["t"]) for e in timed), default=0.0)
    t_end = max((float(e["t"]) for e in timed), default=0.0)
    invokes = {e["id"]: e for e in timed if e["type"] == "invoke"}
    workers = sorted({_worker(e["p"]) for e in timed if e["type"] in ("invoke", "acquire")})
    colour = {w: _PALETTE[i % len(_PALETTE)] for i, w in enumerate(workers)}
    fig = go.Figure()

    # Lease holds: a bar per grant, one trace per worker (the legend filters).
    holds = _holds(timed)
    bars: dict[str, _Bars] = defaultdict(_Bars)
    for e, start, end in holds:
        bars[_worker(e["p"])].add(
            str(e["resource"]), start - t0, end - t0, f"{e['p']} token {e['token']}"
        )
    for w in workers:
        if w in bars:
            b = bars[w]
            fig.add_trace(go.Bar(
                name=f"lease: {w}", orientation="h", y=b.y, x=b.x, base=b.base,
                hovertext=b.text, hoverinfo="text", width=0.6, legendgroup=w,
                marker={"color": colour[w], "opacity": 0.45},
            ))  # fmt: skip

    # Pauses, drawn over the paused worker's leases (else on the nemesis row).
    paused = _Bars()
    pauses = _pauses(timed, t_end)
    for e, start, end in pauses:
        who = str(e.get("worker"))
        text = f"{who} paused (SIGSTOP) {end - start:.2f}s"
        over = [h for h in holds if _worker(h[0]["p"]) == who and h[1] < end and h[2] > start]
        for grant, held_from, held_to in over:
            row = str(grant["resource"])
            paused.add(row, max(held_from, start) - t0, min(held_to, end) - t0, text)
        if not over:
            paused.add("nemesis: pause", start - t0, end - t0, text)
    if paused.y:
        fig.add_trace(go.Bar(
            name=f"worker paused ({len(pauses)})", orientation="h", y=paused.y, x=paused.x,
            base=paused.base, hovertext=paused.text, hoverinfo="text", width=0.3,
            marker={"color": "rgba(0,0,0,0.55)", "pattern": {"shape": "/", "fgcolor": "white"}},
        ))  # fmt: skip

    # Writes at the moment they were sent: one trace (and symbol) per outcome and reason.
    outcome = {e["id"]: e for e in timed if e["type"] in ("ok", "fail", "info")}
    committed = {e["id"] for e in events if e.get("type") == "committed"}
    groups: dict[str, _Points] = defaultdict(_Points)
    categories: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    for wid, inv in invokes.items():
        out = outcome.get(wid)
        category, label = _outcome(out, wid in committed)
        categories[category] += 1
        if category == "rejected":
            reasons[label.split(": ", 1)[1]] += 1
        g = groups[label]
        g.x.append(float(inv["t"]) - t0)
        g.y.append(str(inv["resource"]))
        detail = "" if out is None else str(out.get("error") or out.get("sqlstate") or "")
        g.text.append(f"{wid} token {inv.get('token')}: {label} {detail}".strip())
    other = iter(_OTHER_REASONS * 4)
    for label in sorted(groups, key=_label_order):
        g = groups[label]
        symbol, color = _write_style(label, other)
        fig.add_trace(go.Scatter(
            name=f"write {label} ({len(g.x)})", mode="markers", x=g.x, y=g.y,
            hovertext=g.text, hoverinfo="text",
            marker={"symbol": symbol, "color": color, "size": 8, "line": {"width": 1.5}},
        ))  # fmt: skip

    # Faults: one row and one symbol each.
    for kind, symbol in FAULT_SYMBOLS.items():
        faults = [e for e in timed if e["type"] == kind and e.get("fault", True)]
        if faults:
            fig.add_trace(go.Scatter(
                name=f"fault: {kind} ({len(faults)})", mode="markers",
                x=[float(e["t"]) - t0 for e in faults], y=[f"nemesis: {kind}"] * len(faults),
                hovertext=[_describe(e) for e in faults], hoverinfo="text",
                marker={"symbol": symbol, "size": 11, "color": "#444", "line": {"width": 2}},
            ))  # fmt: skip

    # Violations, on their resource's row.
    placed = [v for v in report.violations if v.t is not None]
    if placed:
        fig.add_trace(go.Scatter(
            name=f"VIOLATION ({len(report.violations)})", mode="markers",
            x=[float(v.t) - t0 for v in placed if v.t is not None],
            y=[str(v.resource) for v in placed],
            hovertext=[f"{v.kind}: {v.message}" for v in placed], hoverinfo="text",
            marker={"symbol": "x-thin-open", "size": 16, "color": "black", "line": {"width": 3}},
        ))  # fmt: skip

    rows = {str(inv["resource"]) for inv in invokes.values()} | set(paused.y)
    fig.update_layout(
        barmode="overlay", hovermode="closest", margin={"t": 30},
        xaxis_title="seconds since the first event (true clock)",
        height=max(420, 70 * len(rows) + 60 * len(FAULT_SYMBOLS) + 200),
        yaxis={"type": "category", "categoryorder": "category descending"},
        legend={"title": {"text": "click to hide or show"}},
    )  # fmt: skip
    body = pio.to_html(fig, include_plotlyjs=True, full_html=False, div_id="timeline")
    Path(path).write_text(_page(title, report, categories, reasons, body), encoding="utf-8")


def _label_order(label: str) -> tuple[int, str]:
    first = ("accepted", "rejected", _CONNECTION, "indeterminate")
    return next(i for i, p in enumerate((*first, "")) if label.startswith(p)), label


def _write_style(label: str, other: Any) -> tuple[str, str]:
    if label == "accepted":
        return "circle", "#2ca02c"
    if label == _CONNECTION:
        return "circle-x-open", "#7f7f7f"
    if label.startswith("indeterminate"):
        return ("diamond" if "committed" in label else "diamond-open"), "#ff7f0e"
    reason = label.split(": ", 1)[1]
    return REASON_SYMBOLS.get(reason) or next(other), "#d62728"


def _page(
    title: str, report: Report, categories: Counter[str], reasons: Counter[str], plot: str
) -> str:
    n = len(report.violations)
    verdict = (
        "<p class='verdict'>The checker found no violation.</p>"
        if not n
        else f"<p class='verdict bad'>The checker found {n} violation{'s' * (n != 1)}.</p>"
    )
    rejected = ", ".join(f"{k} {v}" for k, v in sorted(reasons.items())) or "none"
    counts = (
        "<table class='counts'>"
        f"<tr><td>writes sent</td><td>{sum(categories.values())}</td></tr>"
        f"<tr><td>accepted</td><td>{categories['accepted']}</td></tr>"
        f"<tr><td>rejected by the fence</td><td>{categories['rejected']} ({rejected})</td></tr>"
        f"<tr><td>connection errors (no verdict: not rejections)</td>"
        f"<td>{categories['connection']}</td></tr>"
        f"<tr><td>indeterminate (lost during COMMIT)</td>"
        f"<td>{categories['indeterminate']}</td></tr>"
        "</table>"
    )
    summary = html.escape(format_report(report, max_violations=20))
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>{verdict}{counts}{_HOW_TO_READ}{plot}"
        f"<h2>Checker</h2><pre class='checker'>{summary}</pre></body></html>"
    )


def _symbol_list(symbols: dict[str, str]) -> str:
    return ", ".join(f"{html.escape(k)} <code>{html.escape(v)}</code>" for k, v in symbols.items())


_HOW_TO_READ = f"""
<section class='how'><h2>How to read this</h2><dl>
<dt>Rows</dt><dd>One row per resource (the register the workers write); below them one row per
kind of fault the nemesis caused.</dd>
<dt>Pale bars</dt><dd>A lease: from its grant until its release, or its ttl after the last
renewal; one colour per worker.</dd>
<dt>Dark hatched bars</dt><dd>The worker holding that lease was paused (SIGSTOP) then: what it
writes after the bar ends, it writes late.</dd>
<dt>Markers on a resource row</dt><dd>A write, at the moment it was sent: a green circle was
accepted; a red marker was rejected by the fence, one symbol per reason
({_symbol_list(REASON_SYMBOLS)}); a grey circled x is a connection error (the write never
reached a verdict; counted apart from rejections); an orange diamond is indeterminate (the
connection was lost during COMMIT; filled when the final state shows it committed).</dd>
<dt>Markers on a nemesis row</dt><dd>A fault, when it was caused: {_symbol_list(FAULT_SYMBOLS)}.
</dd>
<dt>Black crosses</dt><dd>Violations the checker found; hover for its message.</dd>
<dt>Legend</dt><dd>The numbers are counts; click an entry to hide or show it, double-click to
show it alone. Hover any mark for its details; drag to zoom.</dd>
</dl></section>
"""
