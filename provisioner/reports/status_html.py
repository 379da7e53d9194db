"""`provision status --html FILE`: the remediation breaker and open incidents at the top, the fleet table, the
incidents' distributions and each node's timeline (transitions, health passes, remediation records) as one
self-contained page: inline CSS, no script, no external asset, every value escaped."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from html import escape
from typing import Any

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin-bottom:2em}th,td{border:1px solid #ccc;padding:.3em .6em;text-align:left}
th{background:#f3f3f3}.state{font-weight:600}.quarantined,.fail,.failed{color:#b00}.in-service,.pass,.ok{color:#070}
ol.timeline{list-style:none;padding-left:1em;border-left:3px solid #ddd}ol.timeline li{margin:.3em 0}
.when{color:#666;font-family:monospace;margin-right:.6em}
.slow{color:#b60;font-weight:600}table.dist td:nth-child(3){width:20em}.bar{background:#8ab;height:.8em}
.seen.unreachable,.seen.error{color:#b00}.seen.yes{color:#070}
.breaker{border:2px solid #b00;background:#fee;padding:.6em 1em;font-weight:600}
"""


def _e(v: Any) -> str:
    return escape("-" if v is None else str(v), quote=True)


def _cls(v: Any) -> str:
    return escape(str(v).replace(" ", "-"), quote=True)


def events(history: Mapping[str, Any]) -> list[tuple[float, str, str, str]]:
    """(time, kind, css class, text) of a host's history, oldest first: transitions, health passes, remediations."""
    out: list[tuple[float, str, str, str]] = []
    for t in history["transitions"]:
        forced = " (forced)" if t["forced"] else ""
        out.append((t["at"], "transition", t["to"], f"{t['from']} -> {t['to']}{forced} by {t['actor']}: {t['reason']}"))
    for r in history["runs"]:
        if r["command"] == "burn-in":
            out.append((r["started"], "burn-in", r["outcome"] or "-", f"burn-in #{r['id']}: {r['outcome']}"))
        if r["command"] == "health":
            bad = f" (failed: {', '.join(r['failed_checks'])})" if r["failed_checks"] else ""
            out.append((r["started"], "health", r["outcome"] or "-", f"health #{r['id']}: {r['outcome']}{bad}"))
    for s in history.get("remediations", []):
        detail = f": {s['detail']}" if s["detail"] else ""
        out.append((s["at"], "remediation", s["outcome"], f"{s['step']} {s['outcome']}{detail}"))
    return sorted(out, key=lambda e: e[0])


def _secs(v: Any) -> str:
    return "-" if v is None else f"{float(v):.1f} s"


def day2_top(day2: Mapping[str, Any] | None, when: Any) -> list[str]:
    """The breaker (when open), the open incidents and the recommendations waiting for --approve."""
    if not day2:
        return []
    out = []
    b = day2["breaker"]
    if b["open"]:
        out.append(f'<p class="breaker" id="breaker">remediation breaker OPEN since {_e(when(b["since"]))}: '
                   f"{_e(b['why'])} (automatic take-outs stopped until provision remediate --close-breaker)</p>")
    inc = day2["open_incidents"]
    out.append(f'<h2>open incidents ({len(inc)})</h2>')
    if inc:
        out.append('<table id="open-incidents"><thead><tr><th>#</th><th>host</th><th>cluster</th><th>source</th>'
                   "<th>cause</th><th>detected</th><th>to detect</th><th>to drain</th></tr></thead><tbody>")
        for r in inc:
            out.append(f'<tr data-incident="{_e(r["id"])}"><td>{_e(r["id"])}</td><td>{_e(r["host"])}</td>'
                       f"<td>{_e(r['cluster'])}</td><td>{_e(r['source'])}</td><td>{_e(r['cause'])}</td>"
                       f"<td>{_e(when(r['detected']))}</td><td>{_secs(r['detect_s'])}</td>"
                       f"<td>{_secs(r['drain_s'])}</td></tr>")
        out.append("</tbody></table>")
    if day2["recommended"]:
        out.append('<h2>recommended, waiting for --approve</h2><ul id="recommended">')
        for a in day2["recommended"]:
            what = a["kind"] + (f" {a['step']}" if a["step"] else "")
            out.append(f"<li>#{_e(a['id'])} {_e(a['host'])}: {_e(what)} ({_e(a['reason'])})</li>")
        out.append("</ul>")
    return out


def distributions(day2: Mapping[str, Any] | None) -> list[str]:
    """The incidents' time to detect, drain, return and between incidents: count, p50, p99, max."""
    if not day2 or not day2.get("incidents"):
        return []
    from provisioner.day2.incidents import distributions as dist

    d = dist(day2["incidents"])
    out = ['<h2>incidents: distributions</h2><table id="incident-distributions"><thead><tr><th>time</th>'
           "<th>count</th><th>p50</th><th>p99</th><th>max</th></tr></thead><tbody>"]
    for name in ("detect", "drain", "return", "between"):
        x = d[name]
        out.append(f'<tr data-metric="{name}"><td>{"to " + name if name != "between" else "between incidents"}'
                   f"</td><td>{x['count']}</td><td>{_secs(x['p50'])}</td><td>{_secs(x['p99'])}</td>"
                   f"<td>{_secs(x['max'])}</td></tr>")
    out.append("</tbody></table>")
    return out


def burnin_cell(r: Mapping[str, Any], when: Any) -> str:
    """The burn-in column: the newest tier, its outcome and failed checks; a slow node's metric and gap (the text
    is node data: escaped)."""
    bi = r.get("burnin")
    text = "-" if bi is None else f"{bi['tier']} {when(bi['ended'])}: {bi['result']}" + (
        f" ({', '.join(bi['failed'][:4])})" if bi["failed"] else "")
    slow = r.get("slow") or []
    for s in slow:
        text += f"; SLOW {s['metric']} -{100 * s['gap']:.1f}%"
    cls = "slow" if slow else (_cls(bi["result"]) if bi else "")
    return f'<td class="{cls}">{_e(text)}</td>'


def distribution_section(dist: Iterable[Mapping[str, Any]]) -> list[str]:
    """Burn-in figures per GPU model and metric: every node's (its slowest GPU) as a bar against the fleet's best,
    the median named, a slow node marked with its gap (BRN018)."""
    dist = list(dist)
    if not dist:
        return []
    out = ['<section id="burn-in-fleet"><h2>burn-in figures per GPU model (slowest GPU of each node)</h2>']
    for d in dist:
        top = max((n["value"] for n in d["nodes"]), default=0.0) or 1.0
        out.append(f'<table class="dist" data-metric="{_cls(d["metric"])}"><caption>{_e(d["model"])}: '
                   f'{_e(d["metric"])}, median {d["median"]:.1f}</caption><tbody>')
        for n in d["nodes"]:
            gap = n["slow_gap"]
            mark = f"SLOW -{100 * gap:.1f}%" if gap is not None else ""
            out.append(f'<tr class="{"slow" if gap is not None else ""}"><td>{_e(n["host"])}</td>'
                       f'<td>{n["value"]:.1f}</td><td><div class="bar" style="width:{100 * n["value"] / top:.0f}%">'
                       f"</div></td><td>{_e(mark)}</td></tr>")
        out.append("</tbody></table>")
    out.append("</section>")
    return out


def render(inventory: str, rows: Iterable[Mapping[str, Any]], histories: Mapping[str, Mapping[str, Any]],
           when: Any, generated: float, day2: Mapping[str, Any] | None = None,
           distribution: Iterable[Mapping[str, Any]] = (), serving: Iterable[Mapping[str, Any]] | None = None) -> str:
    """The page. `rows`: status_rows(); `histories`: {host: view.history()}; `when`: the time formatter; `day2`:
    view.day2_view() (the breaker, open incidents, recommendations, incidents); `distribution`: burn-in figures;
    `serving`: the generation probe per cluster head (status --nodes)."""
    rows = list(rows)
    from provisioner.probes.seen import cell

    head = ("host", "state", "since", "cluster", "last run", "health", "burn-in", "drift", "mark", "driver", "vllm")
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>fleet status: {_e(inventory)}</title><style>{CSS}</style></head><body>",
           f"<h1>fleet status: {_e(inventory)}</h1>", f"<p>generated {_e(when(generated))}</p>",
           *day2_top(day2, when),
           '<table id="status"><thead><tr>' + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"]
    for r in rows:
        last, health, drift = r["last_run"], r["health"], r["drift"]
        lr = "-" if last is None else f"{last['command']} #{last['id']} {when(last['started'])}: {last['outcome']}"
        hl = "-" if health is None else f"{when(health['started'])}: {health['result']}" + (
            f" ({', '.join(health['failed'])})" if health["failed"] else "")
        dr = "-" if drift is None else f"{when(drift['started'])}: {drift['items']} item(s)"
        cells = [f'<td><a href="#node-{_cls(r["host"])}">{_e(r["host"])}</a></td>',
                 f'<td class="state {_cls(r["state"])}">{_e(r["state"])}</td>', f"<td>{_e(when(r['since']))}</td>",
                 f"<td>{_e(r['cluster'])}</td>", f"<td>{_e(lr)}</td>",
                 f'<td class="{_cls(health["result"]) if health else ""}">{_e(hl)}</td>',
                 burnin_cell(r, when), f"<td>{_e(dr)}</td>"]
        for key in ("mark", "driver", "vllm"):  # the seen columns; the title says where the value came from
            f, text = r.get(key) or {}, cell(r.get(key), key)
            word = text.split(" ")[0] if text.split(" ")[0] in ("yes", "unreachable", "error") else ""
            why = f.get("error") or f.get("detail")
            tip = f' title="{_e(why)}"' if why else ""
            cells.append(f'<td class="seen {word}"{tip}>{_e(text)}</td>')
        out.append(f'<tr data-host="{_e(r["host"])}">' + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    if serving is not None:  # the generation probe per cluster head (status --nodes)
        out.append('<table id="serving"><thead><tr><th>cluster</th><th>head</th><th>serves</th></tr></thead><tbody>')
        for p in serving:
            text = f"yes ({p['latency_s']} s)" if p["serves"] else f"NO: {p['reason']}"
            out.append(f'<tr><td>{_e(p["cluster"])}</td><td>{_e(p["head"])} {_e(p["server"])}</td>'
                       f'<td class="seen {"yes" if p["serves"] else "error"}">{_e(text)}</td></tr>')
        out.append("</tbody></table>")
    out += distributions(day2)
    out += distribution_section(distribution)
    for r in rows:
        host = r["host"]
        out.append(f'<section id="node-{_cls(host)}"><h2>{_e(host)}: {_e(r["state"])}</h2>')
        evs = events(histories.get(host, {"transitions": [], "runs": []}))
        if not evs:
            out.append("<p>no history</p></section>")
            continue
        out.append('<ol class="timeline">')
        for at, kind, cls, text in evs:
            out.append(f'<li class="{_cls(kind)} {_cls(cls)}" data-kind="{_cls(kind)}"><span class="when">'
                       f"{_e(when(at))}</span>{_e(text)}</li>")
        out.append("</ol></section>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"
