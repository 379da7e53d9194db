#!/usr/bin/python
# -*- coding: utf-8 -*-
"""provisioner_apt: exact-version apt packages, their apt preferences pin file and their dpkg hold, in one module run.

Why not ansible.builtin.apt + template + dpkg_selections: on a node that is already right (every nightly drift check,
every rerun) those cost one module run per package for the holds and one python-apt cache open per apt task; this
module answers "nothing to do" from one `dpkg-query` call and touches apt only when something must change (then in
one `apt-get install` transaction). benchmarks/README.md has the measurements.
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: provisioner_apt
short_description: Install exact package versions with apt, pin and hold them, in one transaction
description:
  - Reads the installed versions and dpkg selections of I(packages) with one C(dpkg-query) call.
  - Writes I(pin_file) when its content differs from I(pin_content) (apt preferences; written before installing so
    apt resolves with the pin).
  - Installs the packages that are missing or at another version with one C(apt-get install name=version ...)
    (downgrades and held packages allowed), refreshing the apt lists first when I(update_cache) asks for it.
  - Holds (C(apt-mark hold)) the packages with I(hold) true that are not held yet.
  - Supports check mode and diff mode; the result lists the drifted resources (C(resources)).
options:
  packages:
    description:
      - Packages. C(version) is the exact Debian version (omit it to accept any installed version);
        C(hold) (default true when a version is given) keeps dpkg from upgrading it.
      - An entry is either C(name=version) / C(name) (apt's spelling) or a dict with C(name), C(version), C(hold).
    type: list
    elements: raw
    required: true
  pin_file:
    description: Path of the apt preferences file to manage; omit for no pin file.
    type: path
  pin_content:
    description: The full content of I(pin_file).
    type: str
  pin_src:
    description:
      - A template (in the role's C(templates/)) the action plugin renders on the controller into I(pin_content), as
        ansible.builtin.template renders; give one of I(pin_src) and I(pin_content).
    type: str
  update_cache:
    description:
      - Refresh the apt lists before installing when they are older than I(cache_valid_time) seconds.
        Only ever done when something must be installed.
    type: bool
    default: false
  cache_valid_time:
    description: Seconds the apt lists count as fresh; 0 refreshes them whenever something is installed.
    type: int
    default: 3600
  install_recommends:
    description: Install recommended packages too.
    type: bool
    default: false
author: provisioner
"""

EXAMPLES = r"""
- name: Install and hold the CUDA runtime and NCCL
  provisioner_apt:
    pin_file: /etc/apt/preferences.d/cuda-nccl
    pin_src: preferences.j2
    packages:
      - libnccl2=2.27.7-1+cuda12.8
      - {name: dkms, hold: false}
"""

RETURN = r"""
installed:
  description: Packages installed or changed to the wanted version (or that would be, in check mode).
  type: list
  returned: always
held:
  description: Packages newly held (or that would be).
  type: list
  returned: always
versions:
  description: Installed version of every package after the run ("" when not installed).
  type: dict
  returned: always
resources:
  description: Drifted resources as [kind, name] pairs (kind file or package), for provisioner's drift report.
  type: list
  returned: always
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule

LISTS = "/var/lib/apt/lists"


def query(module, names):
    """{name: (version, want, status)} from dpkg-query; absent packages are missing from the dict."""
    rc, out, err = module.run_command(
        ["dpkg-query", "-W", "-f=${Package}\t${Version}\t${Status}\n", "--"] + names,
        environ_update={"LC_ALL": "C"})
    found = {}
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) != 3:
            continue
        name, version, status = parts
        words = status.split()
        want = words[0] if words else ""
        state = words[-1] if words else ""
        found[name] = (version if state == "installed" else "", want)
    return found


def lists_age():
    """Seconds since the apt lists were last refreshed (a large number when they never were)."""
    newest = 0.0
    try:
        for entry in os.scandir(LISTS):
            if entry.is_file() and not entry.name.startswith("lock"):
                newest = max(newest, entry.stat().st_mtime)
    except OSError:
        pass
    return time.time() - newest if newest else float("inf")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            packages=dict(type="list", elements="raw", required=True),
            pin_file=dict(type="path"),
            pin_content=dict(type="str"),
            pin_src=dict(type="str"),  # rendered into pin_content by the action plugin (plugins/action/)
            update_cache=dict(type="bool", default=False),
            cache_valid_time=dict(type="int", default=3600),
            install_recommends=dict(type="bool", default=False),
        ),
        required_together=[["pin_file", "pin_content"]],
        supports_check_mode=True,
    )
    p = module.params
    pkgs = []
    for i, entry in enumerate(p["packages"]):
        if isinstance(entry, str):  # apt's own spelling: name=version or name
            name, _, version = entry.partition("=")
            entry = dict(name=name, version=version)
        name = str(entry.get("name") or "").strip()
        if not name:
            module.fail_json(msg="packages[%d] has no name" % i)
        version = entry.get("version")
        version = str(version).strip() if version not in (None, "") else ""
        hold = entry.get("hold")
        hold = bool(version) if hold is None else module.boolean(hold)
        pkgs.append((name, version, hold))
    names = [n for n, _, _ in pkgs]

    result = dict(changed=False, installed=[], held=[], versions={}, resources=[])
    diffs = []

    # 1. The pin file.
    pin_changed = False
    if p["pin_file"]:
        content = p["pin_content"]
        if content and not content.endswith("\n"):
            content += "\n"
        try:
            with open(p["pin_file"], "r", encoding="utf-8") as f:
                before = f.read()
        except FileNotFoundError:
            before = None
        except OSError as e:
            module.fail_json(msg="cannot read %s: %s" % (p["pin_file"], e))
        pin_changed = before != content
        if pin_changed:
            diffs.append(dict(before=before or "", after=content,
                              before_header=p["pin_file"], after_header=p["pin_file"]))
            result["resources"].append(["file", p["pin_file"]])
            if not module.check_mode:
                tmp = p["pin_file"] + ".provisioner-tmp"
                with open(tmp, "w", encoding="utf-8") as f:
                    f.write(content)
                os.chmod(tmp, 0o644)
                os.chown(tmp, 0, 0)
                os.replace(tmp, p["pin_file"])

    # 2. What is installed and held.
    found = query(module, names)
    to_install, to_hold, prepared = [], [], []
    for name, version, hold in pkgs:
        have, want = found.get(name, ("", ""))
        if not have or (version and have != version):
            to_install.append(name + ("=" + version if version else ""))
            prepared.append("Inst %s%s (%s)" % (name, " [%s]" % have if have else "", version or "latest"))
            result["installed"].append(name)
        if hold and (want != "hold" or name in result["installed"]):
            if want != "hold":
                prepared.append("Hold %s" % name)
                result["held"].append(name)
            to_hold.append(name)
    for name in dict.fromkeys(result["installed"] + result["held"]):
        result["resources"].append(["package", name])
    if prepared:
        diffs.append(dict(prepared="\n".join(prepared) + "\n"))

    # 3. Apply.
    if (to_install or result["held"]) and not module.check_mode:
        env = {"DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C", "NEEDRESTART_MODE": "a"}
        if to_install:
            if p["update_cache"] and (p["cache_valid_time"] <= 0 or lists_age() > p["cache_valid_time"]):
                rc, out, err = module.run_command(["apt-get", "-q", "update"], environ_update=env)
                if rc != 0:
                    module.fail_json(msg="apt-get update failed: %s" % (err or out).strip()[-2000:], rc=rc,
                                     stdout=out, stderr=err)
            cmd = ["apt-get", "-q", "-y", "install", "--allow-downgrades", "--allow-change-held-packages",
                   "-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold"]
            cmd.append("--install-recommends" if p["install_recommends"] else "--no-install-recommends")
            rc, out, err = module.run_command(cmd + to_install, environ_update=env)
            result["stdout"] = out
            if rc != 0:
                module.fail_json(msg="apt-get install %s failed: %s" % (" ".join(to_install), (err or out).strip()[-2000:]),
                                 rc=rc, stdout=out, stderr=err, **{k: result[k] for k in ("installed", "resources")})
        if to_hold:
            rc, out, err = module.run_command(["apt-mark", "hold"] + to_hold, environ_update=env)
            if rc != 0:
                module.fail_json(msg="apt-mark hold %s failed: %s" % (" ".join(to_hold), (err or out).strip()),
                                 rc=rc, stdout=out, stderr=err)
        found = query(module, names)

    result["versions"] = {n: found.get(n, ("", ""))[0] for n in names}
    result["changed"] = bool(pin_changed or result["installed"] or result["held"])
    if module._diff and diffs:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
