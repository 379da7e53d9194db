"""Reboot every GPU node of a running testbed rack N times through roles/nvidia_driver's reboot handler (or another
handlers file), with CPU burners beside it, and count what went wrong after the handler reported success.

Each round: one play notifies the handler (`NVIDIA kernel module changed`, as the driver install does), flushes it,
then runs three ordinary tasks at once, as the next role would. Counted per round and host: the supervisor's `host
rebooted` lines in the host's boot.log (more than one = the host went down twice), every moment its sshd did not
answer after the handler had reported it (0.1 s polling), Ansible's `ssh_retry` lines during the handler (a command
re-run after its connection dropped) and the play's exit status. Needs root and a rack (`provision testbed up`);
run it under the rack lock: `flock /tmp/provisioner-rack.lock python benchmarks/reboot_soak.py --rack NAME`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PLAY = """\
- name: Reboot soak
  hosts: gpu_nodes
  gather_facts: false
  become: true
  vars:
    provision_allow_reboot: true
    __nvidia_driver_kmod_changed: true
    __nvidia_driver_module_stale: false
    nvidia_driver_version: "580.95.05"
    nvidia_driver_reboot_timeout: 900
  tasks:
    - name: Ask for the reboot (as the driver install does)
      ansible.builtin.command: "true"
      changed_when: true
      notify: NVIDIA kernel module changed
    - name: Reboot now
      ansible.builtin.meta: flush_handlers
    - name: after1
      ansible.builtin.command: cat /proc/sys/kernel/random/boot_id
      changed_when: false
    - name: after2
      ansible.builtin.command: "true"
      changed_when: false
    - name: after3
      ansible.builtin.command: "true"
      changed_when: false
  handlers:
    - name: The handlers under test
      ansible.builtin.import_tasks: {handlers}
"""
HANDLER_PREFIX = "RUNNING HANDLER"
BURN = "while True: pass"


def banner(address: str) -> str:
    try:
        with socket.create_connection((address, 22), timeout=0.5) as s:
            s.settimeout(0.5)
            return "up" if s.recv(64).startswith(b"SSH-") else "no-banner"
    except ConnectionRefusedError:
        return "refused"
    except OSError as exc:
        return type(exc).__name__


def one_round(inventory: str, playbook: Path, addrs: dict[str, str], logs: dict[str, Path], settle: float
              ) -> dict[str, object]:
    def rebooted(h: str) -> int:
        return logs[h].read_text(errors="replace").count("host rebooted")

    before = {h: rebooted(h) for h in addrs}
    timeline: dict[str, list[tuple[float, str]]] = {h: [] for h in addrs}
    stop = threading.Event()

    def watch(h: str) -> None:
        last = None
        while not stop.is_set():
            b = banner(addrs[h])
            if b != last:
                timeline[h].append((time.time(), b))
                last = b
            time.sleep(0.1)

    threads = [threading.Thread(target=watch, args=(h,), daemon=True) for h in addrs]
    for t in threads:
        t.start()
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    t0 = time.time()
    p = subprocess.Popen([str(Path(sys.executable).with_name("ansible-playbook")), "-vv", "-i", inventory,
                          str(playbook)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         cwd=ROOT)
    assert p.stdout is not None
    reported: dict[str, float] = {}
    retries: list[str] = []
    unreachable: list[str] = []
    in_reboot = False
    for line in p.stdout:
        if line.startswith(("TASK [", HANDLER_PREFIX)):
            in_reboot = line.startswith(HANDLER_PREFIX) and "Reboot" in line
        if in_reboot and "ssh_retry" in line:  # the command retried is at the end of the ssh argv
            what = "shutdown" if "shutdown -r" in line else "boot_id" if "boot_id" in line else "other"
            retries.append(f"{what}: {line.strip()[-200:]}")
        m = re.match(r"(ok|changed|fatal|failed): \[([\w.-]+)\]", line)
        if m and in_reboot:
            reported[m.group(2)] = time.time()
        if "UNREACHABLE" in line or "Connection refused" in line:
            unreachable.append(line.strip()[:240])
    p.wait()
    seconds = time.time() - t0
    time.sleep(settle)
    stop.set()
    for t in threads:
        t.join()
    downs = {h: [(round(t - reported[h], 1), b) for t, b in timeline[h] if t > reported[h] and b != "up"]
             for h in addrs if h in reported}
    return {"rc": p.returncode, "seconds": round(seconds, 1), "load1": round(os.getloadavg()[0], 1),
            "boots": {h: rebooted(h) - before[h] for h in addrs},
            "down_after_reported": {h: v for h, v in downs.items() if v},
            "ssh_retry_in_handler": retries, "unreachable": unreachable[:6]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rack", required=True)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--handlers", type=Path, default=ROOT / "roles/nvidia_driver/handlers/main.yml")
    ap.add_argument("--burn", type=int, default=8, help="busy Python loops beside the soak (0: none)")
    ap.add_argument("--settle", type=float, default=10.0, help="seconds to keep watching sshd after each play")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    from provisioner_testbed.state import RackState

    st = RackState.load(a.rack)
    if st is None:
        print(f"no rack {a.rack!r}: provision testbed up --name {a.rack}", file=sys.stderr)
        return 2
    addrs = {h.name: h.address for h in st.hosts if h.role == "node"}
    logs = {h: st.dir / "hosts" / h / "boot.log" for h in addrs}
    with tempfile.TemporaryDirectory() as d:
        pb = Path(d) / "soak.yml"
        pb.write_text(PLAY.format(handlers=a.handlers.resolve()))
        burners = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(a.burn)]
        rounds = []
        try:
            for i in range(a.rounds):
                r = one_round(st.inventory, pb, addrs, logs, a.settle)
                rounds.append(r)
                print(json.dumps({"round": i, **r}), flush=True)
        finally:
            for b in burners:
                b.kill()
                b.wait()
    total = {
        "handlers": str(a.handlers), "rounds": len(rounds), "hosts": len(addrs), "burn": a.burn,
        "failed_rounds": sum(r["rc"] != 0 for r in rounds),
        "second_boots": sum(max(0, n - 1) for r in rounds for n in r["boots"].values()),  # type: ignore[attr-defined]
        "sshd_down_after_reported": sum(len(r["down_after_reported"]) for r in rounds),  # type: ignore[arg-type]
        "ssh_retries_in_handler": sum(len(r["ssh_retry_in_handler"]) for r in rounds),  # type: ignore[arg-type]
        "shutdown_reruns": sum(str(x).startswith("shutdown") for r in rounds
                               for x in r["ssh_retry_in_handler"]),  # type: ignore[attr-defined]
        "load1_mean": round(sum(r["load1"] for r in rounds) / max(1, len(rounds)), 1),  # type: ignore[misc]
        "seconds_mean": round(sum(r["seconds"] for r in rounds) / max(1, len(rounds)), 1),  # type: ignore[misc]
    }
    print("TOTAL " + json.dumps(total), flush=True)
    if a.out:
        a.out.write_text(json.dumps({"total": total, "rounds": rounds}, indent=2) + "\n")
    return 0 if total["failed_rounds"] == 0 and total["second_boots"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
