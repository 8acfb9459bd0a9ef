"""``--report run.html``: the run as one self-contained HTML timeline (plotly, JS inlined).

One row per resource: who held the lease when (a bar per grant, coloured by worker, from the
grant until its release or its ttl after the last renewal), each write at the moment it was
sent (accepted, rejected, indeterminate), and every violation as a black cross with its
message on hover; a row per fault kind below (pauses, kills, crashes, clocks, network, issuer
nodes). Needs the ``chaos`` extra (``pip install 'pg-fencekit[chaos]'``).
"""

from __future__ import annotations

import html
from collections import defaultdict
from pathlib import Path
from typing import Any

from fencekit.chaos.checker import Report, format_report
from fencekit.chaos.history import Event

__all__ = ["write_html"]

_PALETTE = (
    "#4C78A8", "#F58518", "#54A24B", "#B279A2", "#9D755D", "#72B7B2", "#EECA3B", "#FF9DA6",
)  # fmt: skip
_FAULTS = ("pause", "kill", "crash", "clock", "net", "node", "bouncer")


def write_html(events: list[Event], report: Report, path: Path, *, title: str) -> None:
    try:
        import plotly.graph_objects as go  # type: ignore[import-untyped]
        import plotly.io as pio  # type: ignore[import-untyped]
    except ImportError as exc:
        raise RuntimeError("--report needs plotly: pip install 'pg-fencekit[chaos]'") from exc
    timed = [e for e in events if e.get("type") not in ("committed", "register")]
    t0 = min((float(e["t"]) for e in timed), default=0.0)
    invokes = {e["id"]: e for e in timed if e["type"] == "invoke"}
    workers = sorted({str(e["p"]).split(".", 1)[0] for e in invokes.values()})
    colour = {w: _PALETTE[i % len(_PALETTE)] for i, w in enumerate(workers)}
    fig = go.Figure()

    # Lease holds: a horizontal bar per grant, one trace per worker (the legend filters).
    holds: dict[str, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    ends: dict[str, dict[str, float]] = {}
    for e in timed:
        if e["type"] == "acquire":
            start = _t0(e)
            ends[str(e.get("holder"))] = {"start": start, "end": start + float(e.get("ttl", 0))}
            ends[str(e.get("holder"))].update(row=0)
        elif e["type"] == "renew" and str(e.get("holder")) in ends:
            h = ends[str(e["holder"])]
            h["end"] = max(h["end"], _t0(e) + (h["end"] - h["start"]))
        elif e["type"] == "release" and str(e.get("holder")) in ends:
            h = ends[str(e["holder"])]
            h["end"] = min(h["end"], _t0(e))
    for e in timed:
        if e["type"] != "acquire":
            continue
        h = ends[str(e.get("holder"))]
        w = str(e["p"]).split(".", 1)[0]
        d = holds[w]
        d["y"].append(str(e["resource"]))
        d["base"].append(h["start"] - t0)
        d["x"].append(max(0.005, h["end"] - h["start"]))
        d["text"].append(f"{e['p']} token {e['token']}")
    for w in workers:
        d = holds.get(w, {})
        if not d:
            continue
        fig.add_trace(go.Bar(
            name=f"lease: {w}", orientation="h", y=d["y"], x=d["x"], base=d["base"],
            hovertext=d["text"], hoverinfo="text", marker={"color": colour[w], "opacity": 0.45},
            width=0.6, legendgroup=w,
        ))  # fmt: skip

    # Writes at the moment they were sent, by outcome.
    outcome = {e["id"]: e for e in timed if e["type"] in ("ok", "fail", "info")}
    committed = {e["id"] for e in events if e.get("type") == "committed"}
    groups: dict[str, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    for wid, inv in invokes.items():
        out = outcome.get(wid)
        kind = out["type"] if out is not None else "info"
        label = {"ok": "write accepted", "fail": "write rejected"}.get(
            kind, "write indeterminate (committed)" if wid in committed
            else "write indeterminate"
        )  # fmt: skip
        g = groups[label]
        g["x"].append(float(inv["t"]) - t0)
        g["y"].append(str(inv["resource"]))
        reason = "" if out is None else str(out.get("reason") or out.get("error") or "")
        g["text"].append(f"{wid} token {inv.get('token')} {label} {reason}".strip())
    styles = {
        "write accepted": ("circle", "#2ca02c"),
        "write rejected": ("x", "#d62728"),
        "write indeterminate": ("diamond-open", "#ff7f0e"),
        "write indeterminate (committed)": ("diamond", "#ff7f0e"),
    }
    for label, (symbol, color) in styles.items():
        g = groups.get(label, {})
        if g:
            fig.add_trace(go.Scatter(
                name=label, mode="markers", x=g["x"], y=g["y"], hovertext=g["text"],
                hoverinfo="text", marker={"symbol": symbol, "color": color, "size": 6},
            ))  # fmt: skip

    # Faults: one row each, a marker at the start, a line while it lasts.
    for kind in _FAULTS:
        xs = [float(e["t"]) - t0 for e in timed if e["type"] == kind and e.get("fault", True)]
        if not xs:
            continue
        text = [_describe(e) for e in timed if e["type"] == kind and e.get("fault", True)]
        fig.add_trace(go.Scatter(
            name=f"fault: {kind}", mode="markers", x=xs, y=[f"nemesis: {kind}"] * len(xs),
            hovertext=text, hoverinfo="text",
            marker={"symbol": "triangle-down", "size": 9, "color": "#555"},
        ))  # fmt: skip

    # Violations, on their resource's row.
    vx = [v.t - t0 for v in report.violations if v.t is not None]
    if vx:
        fig.add_trace(go.Scatter(
            name=f"VIOLATION ({len(report.violations)})", mode="markers", x=vx,
            y=[str(v.resource) for v in report.violations if v.t is not None],
            hovertext=[f"{v.kind}: {v.message}" for v in report.violations if v.t is not None],
            hoverinfo="text", marker={"symbol": "x-thin-open", "size": 16, "color": "black",
                                      "line": {"width": 3}},
        ))  # fmt: skip

    verdict = "no violation" if not report.violations else f"{len(report.violations)} VIOLATIONS"
    fig.update_layout(
        title=f"{html.escape(title)}<br><sub>{verdict}</sub>", barmode="overlay",
        xaxis_title="seconds since the first event (true clock)", hovermode="closest",
        height=max(420, 90 * len({str(e.get('resource')) for e in invokes.values()}) + 300),
        yaxis={"type": "category", "categoryorder": "category descending"},
    )  # fmt: skip
    body = pio.to_html(fig, include_plotlyjs=True, full_html=False)
    summary = html.escape(format_report(report, max_violations=20))
    Path(path).write_text(
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title></head><body>"
        f"<h2>{html.escape(title)}</h2>{body}<h3>Checker</h3><pre>{summary}</pre>"
        "</body></html>",
        encoding="utf-8",
    )


def _t0(e: Event) -> float:
    t0 = e.get("t0")
    return float(t0 if t0 is not None else e["t"])


def _describe(e: Event) -> str:
    skip = ("t", "p", "n", "type")
    return f"{e['type']}: " + ", ".join(f"{k}={v}" for k, v in e.items() if k not in skip)
