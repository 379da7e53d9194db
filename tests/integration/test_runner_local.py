"""Real ansible-runner runs of tiny playbooks against local-connection hosts (no root, no network).

Every assertion is on a real outcome: files on disk, the RunResult folded from the events, the artifacts and the
rendered reports. The counts and check-mode tests read one module-scoped sequence of runs (`applied`).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from provisioner.reports import drift_json, drift_junit, drift_prometheus, drift_text, run_json, run_text
from provisioner.runner import run_playbook

SECRET = "hf_Zq7SECRETtoken_do_not_leak_4242"

PLAYBOOK = """
- name: Tiny site
  hosts: all
  gather_facts: false
  serial: "{{ provision_serial | default(omit) }}"
  max_fail_percentage: "{{ provision_max_fail_percent | default(omit) }}"
  tasks:
    - name: Render nccl.conf
      ansible.builtin.copy:
        dest: "{{ root }}/{{ inventory_hostname }}/nccl.conf"
        content: "NCCL_IB_HCA=mlx5_0\\nNCCL_SOCKET_IFNAME={{ iface }}\\n"
        mode: "0644"
      notify: Restart the consumer
    - name: Marker file
      ansible.builtin.file:
        path: "{{ root }}/{{ inventory_hostname }}/marker"
        state: touch
        modification_time: preserve
        access_time: preserve
    - name: Write the token file
      ansible.builtin.copy:
        dest: "{{ root }}/{{ inventory_hostname }}/token"
        content: "{{ api_token }}\\n"
        mode: "0600"
      no_log: true
    - name: Report something
      ansible.builtin.debug:
        msg: "configured {{ inventory_hostname }}"
    - name: Only on demand
      ansible.builtin.debug:
        msg: never
      when: false
    - name: Break on request
      ansible.builtin.fail:
        msg: "disk full on {{ inventory_hostname }}"
      when: inventory_hostname in (break_hosts | default([]))
    - name: Leak-proof failure
      ansible.builtin.command: "/bin/false {{ api_token }}"
      no_log: true
      changed_when: false
      when: inventory_hostname in (secret_fail_hosts | default([]))
  handlers:
    - name: Restart the consumer
      ansible.builtin.copy:
        dest: "{{ root }}/{{ inventory_hostname }}/restarted"
        content: "{{ 999999 | random }}\\n"
        mode: "0644"
"""


@pytest.fixture()
def site(tmp_path: Path) -> dict[str, Path]:
    return _site(tmp_path)


def _site(tmp_path: Path) -> dict[str, Path]:
    root = tmp_path / "hosts"
    root.mkdir()
    for h in ("alpha", "beta", "gamma"):
        (root / h).mkdir()
    inv_dir = tmp_path / "inv"
    (inv_dir / "group_vars").mkdir(parents=True)
    (inv_dir / "hosts.ini").write_text(
        "[gpu]\n"
        "alpha ansible_connection=local\n"
        "beta ansible_connection=local\n"
        "gamma ansible_connection=local\n"
    )
    (inv_dir / "group_vars" / "all.yml").write_text(
        f"ansible_python_interpreter: {sys.executable}\n"
        f"root: {root}\n"
        "iface: eth0\n"
        f"api_token: {SECRET}\n"
    )
    pb = tmp_path / "site.yml"
    pb.write_text(PLAYBOOK)
    return {"root": root, "inv": inv_dir / "hosts.ini", "pb": pb, "runs": tmp_path / "runs", "tmp": tmp_path}


def _run(site: dict[str, Path], **kw):  # type: ignore[no-untyped-def]
    return run_playbook(site["inv"], playbook=site["pb"], runs_dir=site["runs"],
                        envvars={"ANSIBLE_CACHE_PLUGIN_CONNECTION": str(site["tmp"] / "facts")}, **kw)


def _tree(root: Path) -> dict[str, tuple[str, int, float]]:
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        out[str(p.relative_to(root))] = (digest, st.st_mode, st.st_mtime)
    return out


def _all_text(paths: list[Path]) -> str:
    chunks = []
    for base in paths:
        for p in [base] if base.is_file() else base.rglob("*"):
            if p.is_file():
                chunks.append(p.read_bytes().decode("utf-8", "replace"))
    return "\n".join(chunks)


@pytest.fixture(scope="module")
def applied(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One site through apply, apply again, [beta's nccl.conf edited, gamma's token removed] drift (check mode),
    apply (the fix), drift: each run's result and the files around the first drift."""
    s = _site(tmp_path_factory.mktemp("applied"))
    out: dict[str, Any] = {"site": s, "first": _run(s)}
    out["written"] = {h: ((s["root"] / h / "nccl.conf").read_text(), (s["root"] / h / "token").read_text())
                      for h in ("alpha", "beta", "gamma")}
    out["second"] = _run(s)
    (s["root"] / "beta" / "nccl.conf").write_text("NCCL_IB_HCA=mlx5_0\nNCCL_SOCKET_IFNAME=eth9\n")
    (s["root"] / "gamma" / "token").unlink()
    out["before"] = _tree(s["root"])
    out["drift"] = _run(s, command="drift", check=True)
    out["after"] = _tree(s["root"])
    out["fix"] = _run(s)
    out["nccl_fixed"] = (s["root"] / "beta" / "nccl.conf").read_text()
    out["clean"] = _run(s, command="drift", check=True)
    return out


def test_counts_changed_then_idempotent(applied: dict[str, Any]) -> None:
    first, second = applied["first"], applied["second"]
    assert first.succeeded, first.to_dict()
    assert first.status == "successful" and first.rc == 0
    for name in ("alpha", "beta", "gamma"):
        h = first.hosts[name]
        # ok counts changed results too (as Ansible's recap does): 3 changes + 1 debug + the handler
        assert (h.ok, h.changed, h.failed, h.unreachable, h.skipped) == (5, 4, 0, 0, 3), (name, h)
        nccl, token = applied["written"][name]  # as the first run left them
        assert nccl == "NCCL_IB_HCA=mlx5_0\nNCCL_SOCKET_IFNAME=eth0\n"
        assert token == SECRET + "\n"  # the secret really was used
    assert first.totals()["changed"] == 12

    assert second.succeeded
    assert all(h.changed == 0 and h.ok == 4 for h in second.hosts.values()), second.to_dict()["hosts"]
    # a fresh run directory (ansible-runner private data dir) per run, artifacts and our result beside them
    assert first.run_dir != second.run_dir
    for r in (first, second):
        assert (Path(r.artifact_dir) / "job_events").is_dir()
        saved = json.loads((Path(r.run_dir) / "result.json").read_text())
        assert saved["hosts"]["alpha"]["ok"] == (5 if r is first else 4) and saved["succeeded"] is True
    assert second.retry_file is None


def test_check_mode_reports_diff_and_changes_nothing(applied: dict[str, Any]) -> None:
    nccl = applied["site"]["root"] / "beta" / "nccl.conf"
    drift = applied["drift"]
    assert applied["after"] == applied["before"], "check mode changed files"
    assert drift.succeeded and drift.check
    assert drift.hosts["alpha"].drift == []
    [item] = drift.hosts["beta"].drift  # the handler the change notifies is not a resource of its own
    assert drift.hosts["beta"].changed == 2  # (but it did run, in check mode)
    assert (item.kind, item.resource, item.task) == ("file", str(nccl), "Render nccl.conf")
    assert "-NCCL_SOCKET_IFNAME=eth9" in item.diff and "+NCCL_SOCKET_IFNAME=eth0" in item.diff
    [secret_item] = drift.hosts["gamma"].drift  # a no_log resource: reported by task name, no diff
    assert (secret_item.kind, secret_item.resource, secret_item.diff) == ("file", "Write the token file", None)

    # the gotcha: a plain run right after a check run must apply again (fresh private data dir per run)
    fix = applied["fix"]
    assert fix.succeeded and not fix.check
    assert fix.hosts["beta"].changed == 2 and fix.hosts["gamma"].changed == 1 and fix.hosts["alpha"].changed == 0
    assert applied["nccl_fixed"].endswith("eth0\n")
    clean = applied["clean"]
    assert clean.drift == [] and clean.succeeded


def test_failure_and_unreachable_captured_with_retry_file(site: dict[str, Path]) -> None:
    # a fourth host on an SSH port where nothing listens: unreachable while the others complete
    inv = site["inv"]
    inv.write_text(inv.read_text() + "delta ansible_host=127.0.0.1 ansible_port=9 ansible_connection=ssh "
                                     "ansible_ssh_common_args='-o ConnectTimeout=3'\n")
    r = _run(site, extravars={"break_hosts": ["beta"]})
    assert not r.succeeded and r.rc != 0
    assert r.hosts["alpha"].state == "changed" and r.hosts["gamma"].state == "changed"
    assert r.failed_hosts == ["beta"] and r.unreachable_hosts == ["delta"]
    [f] = r.hosts["beta"].failures
    assert (f.task, f.message) == ("Break on request", "disk full on beta")
    assert r.hosts["delta"].unreachable_message
    assert Path(r.retry_file).read_text().split() == ["beta", "delta"]
    text = run_text.render(r)
    assert "disk full on beta" in text and f"--limit @{r.retry_file}" in text
    data = json.loads(run_json.render(r))
    assert data["failed_hosts"] == ["beta"] and data["unreachable_hosts"] == ["delta"]
    assert data["failures"][0]["message"] == "disk full on beta"

    # the retry file is a valid --limit: only the failed/unreachable hosts run again
    again = _run(site, limit=f"@{r.retry_file}")
    assert sorted(again.targeted) == ["beta", "delta"]
    assert again.hosts["beta"].state == "ok"


def test_serial_batches_and_max_fail_percent_stop(site: dict[str, Path]) -> None:
    r = _run(site, serial="1", max_fail_percent=0, extravars={"break_hosts": ["alpha"]})
    assert [b["batch"] for b in r.batches] == [1]  # batch 1 (alpha) failed: the rollout stopped there
    assert r.batches[0]["hosts"] == ["alpha"]
    assert r.aborted and r.failed_hosts == ["alpha"] and r.not_run_hosts == ["beta", "gamma"]
    assert not (site["root"] / "beta" / "nccl.conf").exists()
    assert Path(r.retry_file).read_text().split() == ["alpha", "beta", "gamma"]
    assert "rollout stopped" in run_text.render(r)

    ok = _run(site, serial="1")
    assert ok.succeeded
    assert [(b["batch"], b["hosts"]) for b in ok.batches] == [(1, ["alpha"]), (2, ["beta"]), (3, ["gamma"])]
    assert {n: h.batch for n, h in ok.hosts.items()} == {"alpha": 1, "beta": 2, "gamma": 3}


def test_no_log_secret_absent_from_reports_and_artifacts(site: dict[str, Path]) -> None:
    os.environ["PROVISION_TEST_TOKEN"] = SECRET  # a token in the operator's environment must not land either
    try:
        runs = [
            _run(site),
            _run(site, extravars={"secret_fail_hosts": ["alpha"]}),
        ]
        (site["root"] / "beta" / "token").write_text("old-token\n")
        runs.append(_run(site, command="drift", check=True))
    finally:
        del os.environ["PROVISION_TEST_TOKEN"]
    failed = runs[1]
    assert failed.failed_hosts == ["alpha"]
    assert "no_log" in failed.hosts["alpha"].failures[0].message  # censored, but still says what happened
    assert runs[2].hosts["beta"].drift[0].resource == "Write the token file"
    reports = []
    for r in runs:
        reports += [run_text.render(r), run_json.render(r), drift_text.render(r), drift_json.render(r),
                    drift_junit.render(r), drift_prometheus.render(r)]
    assert SECRET not in "\n".join(reports)
    assert "old-token" not in "\n".join(reports)
    artifacts = _all_text([site["runs"]])
    assert "Write the token file" in artifacts  # we did read the artifacts
    assert SECRET not in artifacts
    assert "old-token" not in artifacts


def test_run_inputs_do_not_stay_in_the_run_directory(site: dict[str, Path]) -> None:
    # issue 43: ansible-runner dumps -e values into <run dir>/env/extravars and keeps ANSIBLE_BECOME_PASS of the
    # operator's environment in artifacts/<ident>/command (it matches the ANSIBLE_* kept there)
    become, key_data, token = "BecomePw_7731_secret", "KEYDATA_-----BEGIN_9921", "Tok_5510_secret"
    os.environ["ANSIBLE_BECOME_PASS"] = become
    try:
        r = run_playbook(site["inv"], playbook=site["pb"], runs_dir=site["runs"],
                         extravars={"ansible_become_password": become, "site_private_key": key_data},
                         envvars={"ANSIBLE_CACHE_PLUGIN_CONNECTION": str(site["tmp"] / "facts"),
                                  "SITE_API_TOKEN": token})
    finally:
        del os.environ["ANSIBLE_BECOME_PASS"]
    assert r.succeeded, r.error
    run_dir = Path(r.run_dir)
    assert oct(run_dir.stat().st_mode & 0o777) == "0o700"
    assert not (run_dir / "env").exists()  # the inputs ansible-runner dumped are gone once the run ends
    text = _all_text([run_dir])
    assert "configured alpha" in text  # the artifacts are still there
    assert become not in text and key_data not in text and token not in text
    command = json.loads((Path(r.artifact_dir) / "command").read_text())
    assert "ANSIBLE_BECOME_PASS" in command["env_scrubbed"] and "ANSIBLE_CONFIG" in command["env"]


def test_cli_exit_codes_and_json(site: dict[str, Path]) -> None:
    env = dict(os.environ, PROVISION_RUNS_DIR=str(site["runs"]),
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(site["tmp"] / "facts"))
    prov = [sys.executable, "-m", "provisioner.cli"]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        p = subprocess.run([*prov, *args], capture_output=True, text=True, env=env, timeout=300)
        p.stderr = " ".join(p.stderr.split())  # rich wraps long lines
        return p

    ok = cli("run", str(site["inv"]), "--playbook", str(site["pb"]), "--json", "--skip-preflight")
    assert ok.returncode == 0, ok.stderr
    data = json.loads(ok.stdout)
    assert data["schema"] == "provision.run/v1" and data["hosts"]["alpha"]["changed"] == 4
    assert Path(data["artifact_dir"]).is_dir()

    (site["root"] / "alpha" / "nccl.conf").write_text("drifted\n")
    d = cli("drift", str(site["inv"]), "--playbook", str(site["pb"]), "--report", "json", "-q")
    assert d.returncode == 3, d.stderr
    assert json.loads(d.stdout)["summary"]["drifted_hosts"] == ["alpha"]

    bad = cli("run", str(site["inv"]), "--playbook", str(site["pb"]), "--serial", "zero")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "--serial" in bad.stderr
    missing = cli("drift", str(site["tmp"] / "nope.ini"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr and "not found" in missing.stderr
    nomatch = cli("run", str(site["inv"]), "--playbook", str(site["pb"]), "--limit", "nosuchhost")
    assert nomatch.returncode == 2 and "no hosts match" in nomatch.stderr


def test_drift_timer_playbook_writes_units(tmp_path: Path) -> None:
    from provisioner import PLAYBOOKS

    inv = tmp_path / "controller.ini"
    inv.write_text(f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    units, textfiles = tmp_path / "units", tmp_path / "textfile"
    units.mkdir()
    xv = {"drift_become": False, "drift_enable": False, "drift_unit_dir": str(units),
          "drift_textfile_dir": str(textfiles), "drift_inventory": "/srv/inv/rack-a.ini"}
    r = run_playbook(inv, playbook=PLAYBOOKS / "drift_timer.yml", runs_dir=tmp_path / "runs", extravars=xv,
                     envvars={"ANSIBLE_CACHE_PLUGIN_CONNECTION": str(tmp_path / "facts")})
    assert r.succeeded, r.to_dict()
    service = (units / "provision-drift.service").read_text()
    assert (f"drift /srv/inv/rack-a.ini --report prometheus --output {textfiles}/provisioner_drift.prom"
            in service)
    assert "SuccessExitStatus=3" in service and "Type=oneshot" in service
    timer = (units / "provision-drift.timer").read_text()
    assert "OnCalendar=*-*-* 02:30:00" in timer and "WantedBy=timers.target" in timer
    assert textfiles.is_dir()
    assert "--exec-node" not in service
    assert "--quiet --full-every 7\n" in service  # the two-tier drift, with a weekly full check
    # retention after every nightly check, whatever its outcome
    bin0 = next(ln for ln in service.splitlines() if ln.startswith("ExecStart=")).split()[0].removeprefix("ExecStart=")
    assert f"\nExecStopPost=-{bin0} ledger compact /srv/inv/rack-a.ini --keep-days 90\n" in service, service
    # the nightly health gate then the lifecycle policy, after the drift
    rem = (units / "provision-remediate.service").read_text()
    execs = [ln for ln in rem.splitlines() if ln.startswith("ExecStart=")]
    bin_ = next(ln for ln in service.splitlines() if ln.startswith("ExecStart=")).split()[0].removeprefix("ExecStart=")
    assert execs == [f"ExecStart=-{bin_} health /srv/inv/rack-a.ini --prometheus {textfiles}/provisioner_health.prom",
                     f"ExecStart={bin_} remediate /srv/inv/rack-a.ini --source timer"], rem
    assert f"ExecStopPost=-{bin_} incidents /srv/inv/rack-a.ini --prometheus {textfiles}/provisioner_incidents.prom" \
        in rem.splitlines(), rem
    assert "After=network-online.target provision-drift.service" in rem
    assert "OnCalendar=*-*-* 03:30:00" in (units / "provision-remediate.timer").read_text()
    r = run_playbook(inv, playbook=PLAYBOOKS / "drift_timer.yml", runs_dir=tmp_path / "runs",
                     extravars={**xv, "drift_remediate": False},
                     envvars={"ANSIBLE_CACHE_PLUGIN_CONNECTION": str(tmp_path / "facts")})
    assert r.succeeded, r.to_dict()
    assert not (units / "provision-remediate.service").exists() and not (units / "provision-remediate.timer").exists()
    # sharded across execution nodes
    r = run_playbook(inv, playbook=PLAYBOOKS / "drift_timer.yml", runs_dir=tmp_path / "runs",
                     extravars={**xv, "drift_exec_nodes": ["exec01", "exec02"]},
                     envvars={"ANSIBLE_CACHE_PLUGIN_CONNECTION": str(tmp_path / "facts")})
    assert r.succeeded, r.to_dict()
    service = (units / "provision-drift.service").read_text()
    line = next(ln for ln in service.splitlines() if ln.startswith("ExecStart="))
    assert line.endswith("--quiet --full-every 7 --exec-node exec01,exec02"), line
    # without the inventory it refuses with a clear message
    xv.pop("drift_inventory")
    bad = run_playbook(inv, playbook=PLAYBOOKS / "drift_timer.yml", runs_dir=tmp_path / "runs", extravars=xv,
                       envvars={"ANSIBLE_CACHE_PLUGIN_CONNECTION": str(tmp_path / "facts")})
    assert bad.failed_hosts == ["localhost"] and "drift_inventory" in bad.failures[0].message


def test_playbooks_honour_the_serial_contract() -> None:
    """The node-level plays (the ones a rolling onboarding goes through) take --serial / --max-fail-percent
    (docs/development.md, Runner). Controller-side validation and cluster-wide plays (vLLM groups, serving) decide
    for themselves."""
    import yaml

    from provisioner import PLAYBOOKS

    missing = []
    for pb in [PLAYBOOKS / "node.yml", PLAYBOOKS / "gpu_stack.yml", PLAYBOOKS / "fabric.yml"]:
        for play in yaml.safe_load(pb.read_text()) or []:
            if not isinstance(play, dict) or "hosts" not in play or play["hosts"] in ("localhost", "127.0.0.1"):
                continue
            if "provision_serial" not in str(play.get("serial", "")):
                missing.append(f"{pb.name}: play {play.get('name')!r}: serial")
            if "provision_max_fail_percent" not in str(play.get("max_fail_percentage", "")):
                missing.append(f"{pb.name}: play {play.get('name')!r}: max_fail_percentage")
    assert not missing, "plays without the rolling-batch keywords:\n" + "\n".join(missing)


HOSTILE_PLAYBOOK = r"""
- name: Nodes that answer with terminal escape sequences
  hosts: alpha,beta
  gather_facts: false
  tasks:
    - name: Fail with a screen clear, a window title and a forged link in the message
      ansible.builtin.fail:
        msg: "\e[2J\e[H\e]0;owned\athe disk is \e]8;;http://evil.invalid\e\\gone\e]8;;\e\\ \u202eexe.txt"
      when: inventory_hostname == 'alpha'
    - name: A command that prints escapes to stderr and fails
      ansible.builtin.shell: "printf '\\033[2J\\033]0;owned\\007bad sector\\r\\n' >&2; exit 3"
      changed_when: false
      when: inventory_hostname == 'beta'
"""


def test_escape_sequences_from_a_node_are_shown_never_acted_on(site: dict[str, Path]) -> None:
    """What a node sends back is data: ESC/OSC/BEL/CR/bidi characters in a failed task's message or stderr reach
    neither the progress lines, the text report nor the JSON report raw; they are shown escaped (\\x1b...)."""
    pb = site["tmp"] / "hostile.yml"
    pb.write_text(HOSTILE_PLAYBOOK)
    env = dict(os.environ, PROVISION_RUNS_DIR=str(site["runs"]),
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(site["tmp"] / "facts"), COLUMNS="200")
    prov = [sys.executable, "-m", "provisioner.cli"]
    for fmt in ([], ["--json"]):
        p = subprocess.run([*prov, "run", str(site["inv"]), "--playbook", str(pb), "--skip-preflight", *fmt],
                           capture_output=True, text=True, env=env, timeout=300)
        assert p.returncode == 1, p.stdout + p.stderr
        out = p.stdout + p.stderr
        assert not [c for c in out if c in "\x1b\x07\r\u202e"], repr(out[-3000:])
        assert "Traceback" not in out
        flat = "".join(out.split())
        assert "\\x1b[2J" in flat and "\\x07" in flat, out
        if fmt:
            data = json.loads(p.stdout)
            msgs = [f["message"] for h in data["hosts"].values() for f in h["failures"]]
            assert any("thediskis" in "".join(m.split()) and "\\x1b]0;owned\\x07" in m for m in msgs), msgs
            assert any("badsector" in "".join(m.split()) and "\\x1b[2J" in m for m in msgs if "rc 3" in m), msgs
            assert not [m for m in msgs if any(c in m for c in "\x1b\x07\r\u202e")], msgs
