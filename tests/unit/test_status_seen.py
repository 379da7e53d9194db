"""`provision status`'s mark, driver and vllm columns: the parser of the node snippet's output, the values the ledger
already holds (health passes, recorded states), and `--nodes` with run_one replaced (no SSH, no process)."""

from __future__ import annotations

import json
import threading
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_inproc import ROOT, provision
from inventory_factory import write_inventory

from provisioner.ledger import Ledger
from provisioner.ledger.site import path_site
from provisioner.probes import seen
from provisioner.probes.ssh import ExecResult

MARK_BODY = '{"by": "provision onboard", "passed": ["health"], "since": "2026-01-01T00:21:40Z", "why": "gate"}'
FULL = f"""\
Welcome to node01 (a banner line the parser ignores)
seen:mark=1
seen:mark_body={MARK_BODY}
seen:driver_file=/sys/module/nvidia/version
seen:driver=580.95.05
seen:vllm=vllm-0.32.0.dist-info
seen:venv=1
seen:end
"""
PROC = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U16)"


# ---------------------------------------------------------------------------------------------------- the parser
def test_parse_seen_reads_every_line_of_the_snippet() -> None:
    s = seen.parse_seen(FULL)
    assert s == seen.Seen(mark=True, mark_since="2026-01-01T00:21:40Z", mark_by="provision onboard", driver="580.95.05",
                          driver_source="/sys/module/nvidia/version", vllm="0.32.0", venv=True, complete=True)


@pytest.mark.parametrize(("out", "driver", "source"), [
    (f"seen:mark=0\nseen:driver_file=/proc/driver/nvidia/version\nseen:driver={PROC}\nseen:end\n", "580.95.05",
     "/proc/driver/nvidia/version"),
    ("seen:mark=0\nseen:smi=580.82.07\nseen:end\n", "580.82.07", "nvidia-smi"),
    ("seen:mark=0\nseen:smi=\nseen:end\n", None, None),  # nvidia-smi there, no driver answering
    ("seen:mark=0\nseen:driver_file=/sys/module/nvidia/version\nseen:driver=garbage\nseen:end\n", None, None),
    ("seen:mark=0\nseen:end\n", None, None),
])
def test_parse_seen_driver_forms(out: str, driver: str | None, source: str | None) -> None:
    s = seen.parse_seen(out)
    assert (s.driver, s.driver_source, s.mark) == (driver, source, False)


def test_parse_seen_vllm_versions_and_other_dists() -> None:
    s = seen.parse_seen("seen:mark=0\nseen:vllm=vllm-0.33.1+cpu.dist-info\nseen:vllm=vllm-0.32.0.dist-info\n"
                        "seen:vllm=vllm_flash_attn-2.6.1.dist-info\nseen:venv=1\nseen:end\r\n")
    assert (s.vllm, s.venv, s.complete) == ("0.32.0,0.33.1+cpu", True, True)
    none = seen.parse_seen("seen:mark=0\nseen:venv=0\n")
    assert (none.vllm, none.venv, none.complete) == (None, False, False)


@pytest.mark.parametrize("body", ["", "not json", "[1, 2]", '{"by": "someone"}'])
def test_a_mark_without_a_readable_note_is_still_a_mark(body: str) -> None:
    s = seen.parse_seen(f"seen:mark=1\nseen:mark_body={body}\nseen:end\n")
    assert s.mark and s.mark_since is None


@pytest.mark.parametrize("out", ["", "sudo: a password is required\n", "seen:driver=580.95.05\n"])
def test_output_that_is_not_the_snippets_is_an_error(out: str) -> None:
    with pytest.raises(seen.SeenError):
        seen.parse_seen(out)


# ---------------------------------------------------------------------------------------------------- columns
def test_fields_of_a_node_that_answered() -> None:
    f = seen.fields(True, 0, FULL, at=50.0)
    assert f["mark"] == {"value": "yes", "source": "node", "detail": seen.IN_SERVICE, "run": None, "at": 50.0,
                         "age_s": 0, "since": "2026-01-01T00:21:40Z", "by": "provision onboard"}
    assert (f["driver"]["value"], f["driver"]["detail"], f["vllm"]["value"]) == (
        "580.95.05", "/sys/module/nvidia/version", "0.32.0")
    assert [seen.cell(f[k], k) for k in seen.COLUMNS] == ["yes (since 2026-01-01T00:21:40Z)", "580.95.05", "0.32.0"]
    bare = seen.fields(True, 0, "seen:mark=0\nseen:venv=0\nseen:end\n", at=50.0)
    assert [seen.cell(bare[k], k) for k in seen.COLUMNS] == ["no", "none", "none"]
    assert bare["vllm"]["detail"] == "no venv"


def test_fields_of_an_unreachable_node_and_of_a_refused_sudo() -> None:
    f = seen.fields(False, None, "", error="cannot connect to 10.0.0.1:22: timed out", at=1.0)
    assert all(f[k]["unreachable"] and f[k]["error"] == "unreachable: cannot connect to 10.0.0.1:22: timed out"
               and f[k]["value"] is None for k in seen.COLUMNS)
    assert {seen.cell(f[k], k) for k in seen.COLUMNS} == {"unreachable"}
    e = seen.fields(True, 1, "", "sudo: a password is required\n", at=1.0)
    assert e["driver"]["error"] == "the probe exited 1: sudo: a password is required" and not e["driver"]["unreachable"]
    assert {seen.cell(e[k], k) for k in seen.COLUMNS} == {"error"}


def test_cell_of_unknown_and_recorded() -> None:
    assert seen.cell(None) == seen.cell(seen.UNKNOWN) == "-"
    assert seen.cell(seen.field("recorded", "recorded", run=3, at=1.0, now=11.0), "mark") == "recorded"
    assert seen.field("580.95.05", "health", at=1.0, now=11.4)["age_s"] == 10


# ---------------------------------------------------------------------------------------------------- the snippet
def test_command_runs_as_root_directly_else_through_sudo() -> None:
    root = seen.command("root")
    assert root == seen.command(None) == seen.snippet() and not root.startswith("sudo")
    assert seen.command("ubuntu").startswith("sudo -n sh -c ")
    for needle in (seen.IN_SERVICE, "/opt/vllm/venv/lib/python3*/site-packages/vllm-*.dist-info", "/sys/module/nvidia/"
                   "version", "nvidia-smi --query-gpu=driver_version --format=csv,noheader", "echo seen:end"):
        assert needle in root
    assert "'/srv/my venv'/lib/python3*" in seen.snippet("/srv/my venv")


def test_the_paths_are_the_suites() -> None:
    from provisioner.drift.state import FACTS, VENVS
    from provisioner.probes.health import IN_SERVICE

    defaults = yaml.safe_load((ROOT / "roles" / "vllm" / "defaults" / "main.yml").read_text())
    assert seen.IN_SERVICE == IN_SERVICE and seen.VLLM_VENV == defaults["vllm_venv"] == VENVS[0]
    assert set(FACTS) <= set(seen.DRIVER_FILES)


@pytest.mark.parametrize(("value", "venv"), [(None, "/opt/vllm/venv"), ("/srv/vllm", "/srv/vllm"),
                                             ("{{ base }}/venv", "/opt/vllm/venv"), ("rel/venv", "/opt/vllm/venv")])
def test_venv_of_a_host(value: str | None, venv: str) -> None:
    assert seen.venv_of({"vllm_venv": value} if value else {}) == venv


# ---------------------------------------------------------------------------------------------------- the CLI
INI = """\
[gpu_nodes]
n1 ansible_host=10.0.0.1 ansible_user=ubuntu
n2 ansible_host=10.0.0.2
n3 ansible_host=10.0.0.3 vllm_venv=/srv/vllm
n4 ansible_host=10.0.0.4
"""


@pytest.fixture
def site(tmp_path: Path) -> tuple[Path, dict[str, str], Path]:
    inv = write_inventory(tmp_path / "inv", ini=INI)
    db = tmp_path / "ledger.sqlite3"
    return inv, {"PROVISION_LEDGER": str(db)}, db


def fill(db: Path, inv: Path) -> None:
    """n1: recorded state with the mark and the loaded module, then a newer health pass (another driver);
    n2: recorded state with only the driver package; n3: a health pass only; n4: nothing."""
    with Ledger.open(db, site=path_site(inv)) as lg:
        run = lg.run_started("run", "inv", hosts=["n1", "n2"], started=100.0)
        lg.run_finished(run, "ok", hosts=[{"host": "n1", "status": "ok"}, {"host": "n2", "status": "ok"}],
                        ended=200.0)
        lg.put_states([
            ("n1", run, "i", {"file:/etc/provisioner/in-service": "ab 644 0 0", "file:/etc/provisioner": "dir 755 0 0",
                              "other:fact /sys/module/nvidia/version": "580.82.07"}),
            ("n2", run, "i", {"package:nvidia-utils-580": "580.95.05-1 install ok installed",
                              "package:nvidia-kernel-open-580": "580.95.06-1 install ok installed",
                              "package:nvidia-open-570": "570.1-1 deinstall ok config-files"})])
        h = lg.run_started("health", "inv", started=4e9)  # after the records (recorded: now)
        lg.run_finished(h, "failed", hosts=[{"host": "n1", "status": "ok"}, {"host": "n3", "status": "failed"}],
                        health=[("n1", "driver", "pass", "driver 580.95.05 == pinned"),
                                ("n3", "driver", "fail", "driver 580.82.07,580.95.05, pinned 580.95.05"),
                                ("n3", "ecc", "fail", "GPU 1: 2 uncorrectable")])


def rows(site: tuple[Path, dict[str, str], Path], *extra: str) -> dict[str, dict[str, Any]]:
    inv, env, _ = site
    r = provision("status", str(inv), "-f", "json", *extra, env=env)
    assert r.returncode == 0, r.stderr
    return {x["host"]: x for x in json.loads(r.stdout)["hosts"]}


def test_without_nodes_the_ledgers_values(site: tuple[Path, dict[str, str], Path]) -> None:
    fill(site[2], site[0])
    got = rows(site)
    n1, n2, n3, n4 = (got[h] for h in ("n1", "n2", "n3", "n4"))
    assert n1["driver"] | {"age_s": None} == {"value": "580.95.05", "source": "health", "run": 2, "at": 4e9,
                                              "detail": "driver check of health #2", "age_s": None}
    assert n1["mark"]["value"] == "recorded" and n1["mark"]["source"] == "recorded" and n1["mark"]["run"] == 1
    assert n2["driver"]["value"] == "580.95.06" and n2["driver"]["source"] == "recorded"
    assert "package nvidia-kernel-open-580" in n2["driver"]["detail"] and n2["mark"]["value"] is None
    assert n3["driver"]["value"] == "580.82.07,580.95.05" and n3["mark"]["value"] is None
    assert all(r["vllm"]["value"] is None and r["vllm"]["source"] is None for r in got.values())
    assert n4["driver"] == n4["mark"] == seen.UNKNOWN
    text = provision("status", str(site[0]), env=site[1], columns=300).stdout
    lines = {line.split()[1]: line for line in text.splitlines() if line[:1] == "│"}
    assert [c.strip() for c in lines["n1"].split("│")[-4:-1]] == ["recorded", "580.95.05", "-"]
    assert [c.strip() for c in lines["n2"].split("│")[-4:-1]] == ["-", "580.95.06", "-"]
    assert [c.strip() for c in lines["n4"].split("│")[-4:-1]] == ["-", "-", "-"]
    assert "┃ mark" in text and "┃ driver" in text and "┃ vllm" in text


def test_a_newer_record_wins_over_an_older_health_pass(site: tuple[Path, dict[str, str], Path]) -> None:
    inv, _, db = site
    with Ledger.open(db, site=path_site(inv)) as lg:
        h = lg.run_started("health", "inv", started=10.0)
        lg.run_finished(h, "ok", hosts=[{"host": "n1", "status": "ok"}],
                        health=[("n1", "reboot", "pass", "no /run/reboot-required; loaded kernel module 570.1.2 == "
                                                         "installed driver (nvidia-kernel-open-570 570.1.2-1)")])
        run = lg.run_started("run", "inv", hosts=["n1", "n2"], started=20.0)
        lg.run_finished(run, "ok", hosts=[{"host": "n1", "status": "ok"}])
        lg.put_states([("n1", run, "i", {"other:fact /var/lib/hwsim/sys/module/nvidia/version": "580.95.05"})])
    assert rows(site)["n1"]["driver"]["value"] == "580.95.05"
    with Ledger.open(db, site=path_site(inv)) as lg:
        lg.put_states([], drop=["n1"])  # the record gone: the older health pass is what is left
    d = rows(site)["n1"]["driver"]
    assert (d["value"], d["source"], d["detail"]) == ("570.1.2", "health", "reboot check of health #1")


def test_nodes_reads_every_node_in_parallel(site: tuple[Path, dict[str, str], Path],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    fill(site[2], site[0])
    import provisioner.probes.ssh as ssh

    calls: dict[str, str] = {}
    together = threading.Barrier(4, timeout=10)  # every host's exec is in flight at once, or this breaks

    def run_one(t: Any, command: str, timeout: float = 30.0, **kw: Any) -> ExecResult:
        calls[t.name] = command
        together.wait()
        if t.name == "n2":
            return ExecResult(host=t.name, ok=False, error="cannot connect to 10.0.0.2:22: timed out")
        if t.name == "n4":
            return ExecResult(host=t.name, ok=True, rc=1, stderr="sudo: a password is required\n")
        out = FULL if t.name == "n1" else "seen:mark=0\nseen:smi=580.95.05\nseen:venv=0\nseen:end\n"
        return ExecResult(host=t.name, ok=True, rc=0, stdout=out)

    monkeypatch.setattr(ssh, "run_one", run_one)
    got = rows(site, "--nodes")
    assert sorted(calls) == ["n1", "n2", "n3", "n4"]
    assert calls["n1"].startswith("sudo -n sh -c ") and not calls["n2"].startswith("sudo")
    assert "/srv/vllm/lib/python3*" in calls["n3"] and "/opt/vllm/venv/lib/python3*" in calls["n2"]
    assert got["n1"]["mark"]["value"] == "yes" and got["n1"]["mark"]["since"] == "2026-01-01T00:21:40Z"
    assert got["n1"]["vllm"]["value"] == "0.32.0" and got["n1"]["driver"]["source"] == "node"
    assert got["n2"]["driver"]["unreachable"] and got["n2"]["driver"]["error"].startswith("unreachable: ")
    assert (got["n3"]["mark"]["value"], got["n3"]["driver"]["value"], got["n3"]["vllm"]["value"]) == (
        "no", "580.95.05", None)
    assert "password is required" in got["n4"]["vllm"]["error"]

    together.reset()
    inv, env, _ = site
    r = provision("status", str(inv), "--nodes", env=env, columns=300)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    lines = {line.split()[1]: line for line in r.stdout.splitlines() if line[:1] == "│"}
    assert [c.strip() for c in lines["n1"].split("│")[-4:-1]] == [
        "yes (since 2026-01-01T00:21:40Z)", "580.95.05", "0.32.0"]
    assert [c.strip() for c in lines["n2"].split("│")[-4:-1]] == ["unreachable"] * 3
    assert [c.strip() for c in lines["n3"].split("│")[-4:-1]] == ["no", "580.95.05", "none"]
    assert [c.strip() for c in lines["n4"].split("│")[-4:-1]] == ["error"] * 3


class _Cells(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.head: list[str] = []
        self.rows: dict[str, list[tuple[str, dict[str, str | None]]]] = {}
        self._in: str | None = None
        self._host = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "tr" and a.get("data-host"):
            self._host = str(a["data-host"])
            self.rows[self._host] = []
        elif tag in ("th", "td"):
            self._in = tag
            if tag == "td":
                self.rows[self._host].append(("", a))

    def handle_endtag(self, tag: str) -> None:
        if tag in ("th", "td"):
            self._in = None

    def handle_data(self, data: str) -> None:
        if self._in == "th":
            self.head.append(data)
        elif self._in == "td":
            text, a = self.rows[self._host][-1]
            self.rows[self._host][-1] = (text + data, a)


def test_html_has_the_columns(site: tuple[Path, dict[str, str], Path], tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    fill(site[2], site[0])
    inv, env, _ = site
    page = tmp_path / "status.html"
    assert provision("status", str(inv), "--html", str(page), env=env).returncode == 0
    p = _Cells()
    p.feed(page.read_text())
    assert p.head[-3:] == ["mark", "driver", "vllm"]
    n1 = p.rows["n1"][-3:]
    assert [t for t, _ in n1] == ["recorded", "580.95.05", "-"]
    assert n1[1][1]["title"] == "driver check of health #2" and "title" not in n1[2][1]

    import provisioner.probes.ssh as ssh

    monkeypatch.setattr(ssh, "run_one", lambda t, c, timeout=30.0, **kw: ExecResult(host=t.name, ok=False,
                                                                                    error="refused <&>"))
    assert provision("status", str(inv), "--nodes", "--html", str(page), env=env).returncode == 0
    p = _Cells()
    p.feed(page.read_text())
    cell = p.rows["n2"][-1]
    assert cell[0] == "unreachable" and cell[1]["class"] == "seen unreachable"
    assert cell[1]["title"] == "unreachable: refused <&>" and "refused &lt;&amp;&gt;" in page.read_text()


def test_bulk_status_rows_equal_the_per_host_queries(site: tuple[Path, dict[str, str], Path]) -> None:
    """status_rows reads the runs newest first in bulk (issue 47); each row must be what the per-host queries say."""
    from provisioner.inventory import load_fleet
    from provisioner.ledger.view import burnin_row, burnin_slow, cluster_name, recorded_seen, status_rows

    inv, _, db = site
    fill(db, inv)
    with Ledger.open(db, site=path_site(inv)) as lg:
        d = lg.run_started("drift", "inv", started=5e9)
        lg.run_finished(d, "drift", hosts=[{"host": "n1", "status": "drift"}, {"host": "n2", "status": "ok"}],
                        drift=[("n1", "file:/etc/nccl.conf"), ("n1", "package:x")])
        k = lg.run_started("run", "inv", hosts=["n2"], started=6e9, pid=2**31 - 2)  # killed: interrupted
        lg.record_transition("n2", "new", "provisioning", reason="first", actor="t")
        lg.record_transition("n2", "provisioning", "failed", reason="second", actor="t")
    fleet = load_fleet(inv)
    with Ledger.open(db, site=path_site(inv)) as lg:
        got = status_rows(fleet, lg, now=7e9)
        want = []
        for host in ("n1", "n2", "n3", "n4"):
            last, health, drift = lg.last_outcome(host), lg.last_run_for(host, "health"), lg.last_run_for(host, "drift")
            moved = lg.transitions(host)
            want.append({
                "host": host, "state": lg.state(host)[0], "since": lg.state(host)[1],
                "reason": moved[-1].reason if moved else None, "cluster": cluster_name(fleet, host),
                "last_run": None if last is None else {
                    "id": last[0].id, "command": last[0].command, "started": last[0].started,
                    "status": last[0].status, "outcome": last[1], "run_dir": last[0].run_dir},
                "health": None if health is None else {
                    "run": health[0].id, "started": health[0].started, "result": health[1],
                    "failed": [h["check"] for h in lg.health(host, health[0].id) if h["result"] == "fail"]},
                "drift": None if drift is None else {
                    "run": drift[0].id, "started": drift[0].started, "outcome": drift[1],
                    "items": len(lg.drift_items(drift[0].id, host))},
                "burnin": burnin_row(lg, host),
                "slow": [{"metric": x.metric, "value": x.value, "median": x.median, "gap": x.gap,
                          "message": x.message} for x in burnin_slow(fleet, lg) if x.host == host],
                **recorded_seen(lg, host, lg.records([host]).get(host), 7e9)})
    assert got == want
    assert got[1]["last_run"]["id"] == k and got[1]["last_run"]["outcome"] == "interrupted"
    assert got[0]["drift"]["items"] == 2 and got[1]["reason"] == "second"
    assert got[2]["health"]["failed"] == ["driver", "ecc"]
