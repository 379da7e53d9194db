"""`provision status` as text: one table row per node when the whole table fits the console's width, else one block
per node (host name on its own line, then `key: value` lines). A host name is never cut, whatever the width (a
terminal of 80 columns, a pipe, a log)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

COLUMNS = ("host", "state", "since", "cluster", "last run", "health", "burn-in", "drift", "mark", "driver", "vllm")
WIDE = 100_000
#: states whose reason the text shows (the JSON has every host's reason)
REASON_STATES = ("quarantined", "maintenance", "draining", "retired")


def cells(r: dict[str, Any], when: Callable[[float | None], str], cell: Callable[..., str]) -> dict[str, str]:
    """One status row's text per column (and `reason`, empty unless the state is one of REASON_STATES)."""
    last, health, drift = r["last_run"], r["health"], r["drift"]
    lr = "-" if last is None else f"{last['command']} #{last['id']} {when(last['started'])}: {last['outcome']}" + (
        f" (run {last['status']})" if last["status"] in ("running", "interrupted")
        and last["status"] != last["outcome"] else "")
    hl = "-" if health is None else f"{when(health['started'])}: {health['result']}" + (
        f" ({', '.join(health['failed'])})" if health["failed"] else "")
    dr = "-" if drift is None else f"{when(drift['started'])}: {drift['items']} item(s)" + (
        "" if drift["outcome"] in ("ok", "changed") else f" ({drift['outcome']})")
    bi = r.get("burnin")
    bl = "-" if bi is None else f"{bi['tier']} {when(bi['ended'])}: {bi['result']}" + (
        f" ({', '.join(bi['failed'][:4])}{' ...' if len(bi['failed']) > 4 else ''})" if bi["failed"] else "")
    for s in r.get("slow") or []:
        bl += f"; SLOW {s['metric']} -{100 * s['gap']:.1f}%"
    reason = (r.get("reason") or "") if r["state"] in REASON_STATES else ""
    return {"host": r["host"], "state": r["state"], "since": when(r["since"]), "cluster": r["cluster"] or "-",
            "last run": lr, "health": hl, "burn-in": bl, "drift": dr, "mark": cell(r.get("mark"), "mark"),
            "driver": cell(r.get("driver")), "vllm": cell(r.get("vllm")), "reason": reason}


def table(title: str, rows: Sequence[dict[str, str]]) -> Any:
    """The wide layout: every column whole (no_wrap); `reason` only when a row has one."""
    from rich.table import Table
    from rich.text import Text

    cols = [*COLUMNS, *(("reason",) if any(r["reason"] for r in rows) else ())]
    t = Table(title=Text(title), title_justify="left", highlight=False)
    for c in cols:
        t.add_column(c, no_wrap=True, overflow="ignore")
    for r in rows:
        t.add_row(*(Text(r[c]) for c in cols))
    return t


def stacked(title: str, rows: Sequence[dict[str, str]]) -> list[str]:
    """The narrow layout: per node its name, then its state, reason and the other columns, one per line."""
    out = [title]
    for r in rows:
        out.append("")
        out.append(r["host"])
        out.append(f"  state:    {r['state']}" + (f" since {r['since']}" if r["since"] != "-" else ""))
        if r["reason"]:
            out.append(f"  reason:   {r['reason']}")
        out.append(f"  cluster:  {r['cluster']}")
        out.append(f"  last run: {r['last run']}")
        out.append(f"  health:   {r['health']}")
        out.append(f"  burn-in:  {r['burn-in']}")
        out.append(f"  drift:    {r['drift']}")
        out.append(f"  mark: {r['mark']}   driver: {r['driver']}   vllm: {r['vllm']}")
    return out


def render(console: Any, title: str, rows: Sequence[dict[str, str]]) -> None:
    """Print the wide table when its natural width fits the console, else the stacked blocks (plain text: a value
    longer than the line wraps as the terminal wraps it, never cut). No markup is interpreted in either."""
    from rich.measure import Measurement
    from rich.text import Text

    t = table(title, rows)
    natural = Measurement.get(console, console.options.update(max_width=WIDE), t).maximum  # rich clamps to max_width
    if natural <= console.width:
        console.print(t)
        return
    for line in stacked(title, rows):
        console.print(Text(line), soft_wrap=True)
