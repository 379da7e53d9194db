"""Drain and return as pure data: which clusters a set of targets takes out (a TP/PP cluster goes as a whole), the
heads the balancer must stop sending to, the balancer's drained list after a change, and vLLM's in-flight count.
No I/O: day2/executor.py acts on these (drain_clusters, return_clusters)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from provisioner.errors import UsageError
from provisioner.model import Fleet

#: vLLM's gauges of requests on the engine (running) and queued for it (waiting)
_INFLIGHT = re.compile(r"^vllm:num_requests_(?:running|waiting)(?:\{[^}]*\})? (\S+)$", re.M)


@dataclass(frozen=True)
class Head:
    """A cluster's head as the balancer knows it: `address:port` is the nginx server line's address."""

    cluster: str
    host: str
    address: str
    port: int

    @property
    def server(self) -> str:
        return f"{self.address}:{self.port}"


@dataclass(frozen=True)
class Plan:
    """What draining (or returning) `targets` touches: whole clusters, their members in node_rank order, their
    heads, the hosts outside any cluster, and the notes to print (a cluster going as a whole)."""

    clusters: tuple[str, ...]
    members: Mapping[str, tuple[str, ...]]
    heads: tuple[Head, ...]
    loose: tuple[str, ...]
    notes: tuple[str, ...]

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(h for c in self.clusters for h in self.members[c]) + self.loose


def plan(fleet: Fleet, targets: Iterable[str]) -> Plan:
    """Resolve host and cluster names (UsageError for anything else) to whole clusters, in the order given."""
    from provisioner.monitoring import fleet_targets

    clusters: list[str] = []
    loose: list[str] = []
    notes: list[str] = []
    for t in targets:
        if t in fleet.clusters:
            if t not in clusters:
                clusters.append(t)
            continue
        if t not in fleet.hosts:
            known = ", ".join(sorted(fleet.clusters)) or "none"
            raise UsageError(f"{t} is neither a host nor a vLLM cluster of the inventory (clusters: {known})",
                             path=str(fleet.source))
        of = sorted(fleet.cluster_of(t))
        if not of:
            if t not in loose:
                loose.append(t)
            continue
        for c in of:
            if c not in clusters:
                clusters.append(c)
                others = [m for m in fleet.clusters[c].members if m != t]
                if others and t in fleet.clusters[c].members:
                    notes.append(f"{t}: cluster {c} drains as a whole (with {', '.join(others)})")
    heads_by = {h["cluster"]: h for h in fleet_targets(fleet)["heads"]}
    heads = tuple(Head(c, heads_by[c]["host"], heads_by[c]["address"], heads_by[c]["port"])
                  for c in clusters if c in heads_by)
    return Plan(clusters=tuple(clusters), members={c: fleet.clusters[c].members for c in clusters}, heads=heads,
                loose=tuple(h for h in loose if not any(h in fleet.clusters[c].members for c in clusters)),
                notes=tuple(notes))


def drained_list(current: Iterable[str], *, add: Iterable[str] = (), remove: Iterable[str] = ()) -> list[str]:
    """The balancer's drained servers after adding and removing some (sorted, unique, blank lines dropped)."""
    out = {s.strip() for s in current if s.strip()} | {s for s in add}
    return sorted(out - set(remove))


_SERVER = (r"^(?P<head>\s*server\s+{addr}\b[^;#]*?)(?P<down>\s+down)?;(?P<tail>\s*#\s*\S+)"
           r"(?: \(drained: provision drain\))?$")


def rewrite_conf(conf: str, *, add: Iterable[str] = (), remove: Iterable[str] = ()) -> str | None:
    """The balancer's nginx config with the `add` servers rendered `down` and the `remove` ones not, byte for byte
    as templates/nginx-vllm.conf.j2 renders a drained head; None when a server's line is not found (then only the
    playbook may change it)."""
    out = conf
    for server, drained in [(s, True) for s in add] + [(s, False) for s in remove]:
        rx = re.compile(_SERVER.format(addr=re.escape(server)), re.M)
        if not rx.search(out):
            return None
        down, note = (" down", " (drained: provision drain)") if drained else ("", "")
        out = rx.sub(rf"\g<head>{down};\g<tail>{note}", out)
    return out


def inflight(metrics: str) -> int | None:
    """Requests running + waiting on a vLLM engine, from its /metrics text (None: no such gauge in it)."""
    values = []
    for m in _INFLIGHT.finditer(metrics[:4 * 1024 * 1024]):  # the node's text is data: bounded, numbers only
        try:
            v = float(m.group(1))
        except ValueError:
            continue
        if v == v and abs(v) != float("inf"):
            values.append(v)
    return int(sum(values)) if values else None


@dataclass(frozen=True)
class LbPaths:
    """Where the drain's step over SSH writes on a balancer. `conf`: the file that carries the drained `down`s
    (nginx's live file, or with the active health check its rendered source); `checker`: None, or the active
    check's own command (as its systemd unit runs it), which writes the live file from `conf`, runs `nginx -t` and
    reloads nginx."""

    drained: str
    conf: str
    checker: tuple[str, ...] | None = None


def direct_paths(fleet: Fleet, host: str) -> LbPaths | None:
    """The paths of balancer `host` as serving_lb resolves them (its defaults < the host's variables), for the
    drain's step over SSH; None when the playbook must run instead: a path or value is not a plain one."""
    from provisioner.monitoring import ansible_bool, template_context

    v = template_context(fleet, roles=("serving_lb",), host=host)
    drained, conf = str(v.get("serving_lb_drained_file")), str(v.get("serving_lb_conf_file"))
    checker: tuple[str, ...] | None = None
    if ansible_bool(v["serving_lb_active_health"]):  # the role default is in v: no second default here
        source = f"{v.get('serving_lb_state_dir')}/vllm-lb.conf.in"
        script = f"{v.get('serving_lb_libexec_dir')}/vllm-lb-healthcheck.py"
        probe, check, timeout = (str(v.get(k)) for k in ("serving_lb_probe_file", "serving_lb_check_bin",
                                                          "serving_lb_active_health_timeout"))
        plain = all("{{" not in x and x.startswith("/") and not any(c.isspace() for c in x)
                    for x in (script, probe, check, conf))
        if not (plain and re.fullmatch(r"\d+(\.\d+)?", timeout)):
            return None
        checker = ("/usr/bin/python3", "-B", script, "--probe", probe, "--source", source, "--dest", conf,
                   "--timeout", timeout, "--check-cmd", check)
        conf = source
    if any("{{" in x or not x.startswith("/") for x in (drained, conf)):
        return None
    return LbPaths(drained, conf, checker)


def balancer_script(paths: LbPaths, drained_now: Iterable[str], conf: str, *, add: Iterable[str] = (),
                    remove: Iterable[str] = ()) -> str | None:
    """The shell script (run as root on the balancer) of the drain's step over SSH, from what the balancer has now
    (its drained list, the text of `paths.conf`): the new list and the servers' `down` written, then `nginx -t` and a
    reload (the old config put back and exit 7 if the check fails); with the active check, its own command does the
    check and the reload. None when a server's line is not found (the playbook must run)."""
    import base64
    import shlex

    add, remove = list(add), list(remove)
    new = rewrite_conf(conf, add=add, remove=remove)
    if new is None:
        return None
    lst = "".join(x + "\n" for x in drained_list(drained_now, add=add, remove=remove))
    b64 = {k: base64.b64encode(x.encode()).decode() for k, x in (("conf", new), ("list", lst))}
    d, c = shlex.quote(paths.drained), shlex.quote(paths.conf)
    parent = shlex.quote(paths.drained.rsplit("/", 1)[0] or "/")
    # the active check prints one JSON line: not needed here
    apply = f"{shlex.join(paths.checker)} >/dev/null" if paths.checker else "nginx -t >/dev/null 2>&1"
    reload = "" if paths.checker else "systemctl reload nginx; "
    return (f"set -e; install -d -m 0755 -o root -g root {parent}; "
            f"echo {b64['list']} | base64 -d > {d}.tmp; chmod 0644 {d}.tmp; cp -p {c} {c}.bak; "
            f"echo {b64['conf']} | base64 -d > {c}.tmp; chmod 0644 {c}.tmp; mv {c}.tmp {c}; "
            f"if {apply}; then mv {d}.tmp {d}; rm -f {c}.bak; {reload}"
            f"else mv {c}.bak {c}; rm -f {d}.tmp; exit 7; fi")
