"""`provision status --html FILE`: the fleet table and each node's timeline (transitions, health passes,
remediation records) as one self-contained page: inline CSS, no script, no external asset, every value escaped."""

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
.seen.unreachable,.seen.error{color:#b00}.seen.yes{color:#070}
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
        if r["command"] == "health":
            bad = f" (failed: {', '.join(r['failed_checks'])})" if r["failed_checks"] else ""
            out.append((r["started"], "health", r["outcome"] or "-", f"health #{r['id']}: {r['outcome']}{bad}"))
    for s in history.get("remediations", []):
        detail = f": {s['detail']}" if s["detail"] else ""
        out.append((s["at"], "remediation", s["outcome"], f"{s['step']} {s['outcome']}{detail}"))
    return sorted(out, key=lambda e: e[0])


def render(inventory: str, rows: Iterable[Mapping[str, Any]], histories: Mapping[str, Mapping[str, Any]],
           when: Any, generated: float, serving: Iterable[Mapping[str, Any]] | None = None) -> str:
    """The page. `rows`: status_rows(); `histories`: {host: view.history()}; `when`: the time formatter."""
    rows = list(rows)
    from provisioner.probes.seen import cell

    head = ("host", "state", "since", "cluster", "last run", "health", "drift", "mark", "driver", "vllm")
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>fleet status: {_e(inventory)}</title><style>{CSS}</style></head><body>",
           f"<h1>fleet status: {_e(inventory)}</h1>", f"<p>generated {_e(when(generated))}</p>",
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
                 f'<td class="{_cls(health["result"]) if health else ""}">{_e(hl)}</td>', f"<td>{_e(dr)}</td>"]
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
