#!/usr/bin/env python3
"""node_health: is this GPU node fit to serve? One JSON result per check; exit 0 healthy, 1 a check failed, 2 usage.

Python 3.9+ standard library only, plus nodeparse.py next to this file (the tool-output parsers, shared with the
provisioner CLI: provisioner/probes/nodeparse.py). roles/node_health installs both in one directory on every GPU node
(`provision health` ships both too); runnable by hand there:

    python3 node_health.py --gpu-count 8 --gpu-name "NVIDIA H100 80GB HBM3" --driver 580.95.05 \
        --ib-hca "=mlx5_0:1,mlx5_1:1" --ib-rate 400 --busbw-min 330

Checks (each prints one JSON object per line, `--format text` for a table):
  gpu            GPU count and model (nvidia-smi --query-gpu)
  driver         driver version == the pinned one
  reboot         no reboot pending: no /run/reboot-required, and the loaded NVIDIA kernel module is the installed
                 driver (a node whose driver changed serves only after it rebooted)
  persistence    persistence mode enabled on every GPU
  fabricmanager  nvidia-fabricmanager active, its version == the driver's, fabric state Completed (NVSwitch systems)
  ecc            no uncorrectable ECC errors (volatile) and no pending / failed row remaps
  xid            no critical XIDs in the kernel log (/dev/kmsg read non-blocking, --kmsg FILE, or journalctl -k)
  nvlink         every NVLink of every GPU active (multi-GPU nodes)
  ib             every HCA port named by NCCL_IB_HCA: State ACTIVE, phys LinkUp, rate == expected (sysfs)
  socket_ifname  an interface NCCL_SOCKET_IFNAME selects exists and is up (NCCL's bootstrap: without one it fails
                 with "Bootstrap : no socket interface found")
  gpudirect      nvidia-peermem loaded, or DMA-BUF usable (open kernel modules on kernel >= 5.12)
  acs            no PCIe bridge above a GPU or HCA has ACS redirect on (`lspci -D -vvv` ACSCtl ReqRedir/CmpltRedir;
                 NCCL: ACS must be off for GPUDirect P2P/RDMA); warns on a translating IOMMU
  allreduce      single-node all-reduce bus bandwidth (nccl-tests all_reduce_perf, else torch.distributed/NCCL)

Watch mode (`--watch SECONDS --textfile FILE`): runs the fault checks (xid, ecc, nvlink, ib, fabricmanager unless
--only says otherwise) every SECONDS and rewrites FILE (node_exporter's textfile collector, atomically) with
provisioner_node_fault{signal=CHECK} 1/0 and provisioner_node_xid_fatal{xid=CODE}; nothing on stdout; runs until
stopped (the node_health role's provisioner-node-watch.service). docs/monitoring.md, "Node signals".

A result: {"check": ..., "status": "pass"|"fail"|"warn"|"skip", "message": ..., "expected": ..., "found": ...}.
A check asked for as `required` (--fabricmanager, --allreduce) never skips: when it cannot run here it fails, saying
why.
The last line is {"check": "summary", "status": "pass"|"fail", "failed": [...], "host": ...}.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from nodeparse import (
    CRITICAL_XIDS,
    REBOOT_REQUIRED_FILE,
    acs_message,
    acs_redirects,
    acs_unreadable,
    dig,
    efa_devices,
    iommu_mode,
    parse_fi_info,
    parse_ib_sysfs,
    parse_imex_ctl,
    parse_lspci,
    parse_nccl_conf,
    parse_nvlink_status,
    parse_dpkg_installed,
    parse_nvrm_version,
    parse_query_csv,
    parse_smi_q,
    parse_xids,
    reboot_verdict,
    select_ib_hcas,
    select_interfaces,
)

VERSION = "1.0"

CHECKS = ("gpu", "driver", "reboot", "persistence", "fabricmanager", "ecc", "xid", "nvlink", "ib", "socket_ifname", "gpudirect",
          "acs", "efa", "nvlsm", "imex", "allreduce")

QUERY_FIELDS = "index,name,memory.total,driver_version,persistence_mode,pci.bus_id"
ECC_FIELDS = "index,ecc.mode.current,ecc.errors.uncorrected.volatile.total,remapped_rows.pending,remapped_rows.failure"


# ----------------------------------------------------------------------------------------------------- results
def result(check, status, message, expected=None, found=None, **extra):
    r = {"check": check, "status": status, "message": message}
    if expected is not None:
        r["expected"] = expected
    if found is not None:
        r["found"] = found
    r.update(extra)
    return r


class Ctx:
    """What the checks share: arguments and the outputs of commands run once."""

    def __init__(self, args):
        self.args = args
        self._cache = {}

    def run(self, argv, timeout=60):
        """(rc, stdout, stderr); rc 127 when the program is missing, 124 on timeout. Cached per argv."""
        key = tuple(argv)
        if key in self._cache:
            return self._cache[key]
        exe = argv[0]
        if os.sep not in exe and shutil.which(exe) is None:
            out = (127, "", "%s: not found" % exe)
        else:
            try:
                p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                                   universal_newlines=True, errors="replace")
                out = (p.returncode, p.stdout, p.stderr)
            except FileNotFoundError:
                out = (127, "", "%s: not found" % exe)
            except subprocess.TimeoutExpired:
                out = (124, "", "%s: timed out after %ss" % (exe, timeout))
            except OSError as exc:
                out = (126, "", "%s: %s" % (exe, exc))
        self._cache[key] = out
        return out

    def smi(self, *a, timeout=60):
        return self.run([self.args.nvidia_smi] + list(a), timeout=timeout)

    def gpus(self):
        """Parsed --query-gpu rows, or raise CheckError."""
        if "gpus" not in self._cache:
            rc, out, err = self.smi("--query-gpu=" + QUERY_FIELDS, "--format=csv,noheader,nounits")
            if rc != 0:
                self._cache["gpus"] = CheckError("nvidia-smi failed (rc %d): %s" % (rc, _first(err or out)))
            else:
                self._cache["gpus"] = parse_query_csv(out, QUERY_FIELDS.split(","))
        g = self._cache["gpus"]
        if isinstance(g, CheckError):
            raise g
        return g

    def smi_q(self):
        """`nvidia-smi -q` parsed into nested dicts (one per GPU under 'gpus'), or None."""
        if "smi_q" not in self._cache:
            rc, out, _ = self.smi("-q")
            self._cache["smi_q"] = parse_smi_q(out) if rc == 0 else None
        return self._cache["smi_q"]


class CheckError(Exception):
    pass


def _first(text):
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


# ----------------------------------------------------------------------------------------------------- parsers
def read_nccl_conf(path):
    """nccl.conf's settings as NCCL takes them (the first line of a key wins); {} when unreadable."""
    return parse_nccl_conf(_read(path) or "")


def strip_pkg_version(v):
    """'580.95.05-1' -> '580.95.05' (a Debian revision or epoch is not part of the driver version)."""
    v = (v or "").strip()
    if ":" in v:
        v = v.split(":", 1)[1]
    return v.split("-", 1)[0]


# ----------------------------------------------------------------------------------------------------- checks
def check_gpu(ctx):
    a = ctx.args
    gpus = ctx.gpus()
    names = sorted({g.get("name", "") for g in gpus})
    found = {"count": len(gpus), "names": names,
             "memory_mib": sorted({g.get("memory.total", "") for g in gpus})}
    problems = []
    if a.gpu_count is not None and len(gpus) != a.gpu_count:
        problems.append("%d GPUs, expected %d" % (len(gpus), a.gpu_count))
    if a.gpu_name:
        bad = [g for g in gpus if g.get("name") not in a.gpu_name]
        if bad:
            problems.append("GPU %s is %r, expected %s" % (bad[0].get("index"), bad[0].get("name"),
                                                           " or ".join(repr(n) for n in a.gpu_name)))
    if not gpus:
        problems.append("nvidia-smi lists no GPU")
    exp = {"count": a.gpu_count, "names": a.gpu_name or None}
    if problems:
        return result("gpu", "fail", "; ".join(problems), exp, found)
    return result("gpu", "pass", "%d x %s" % (len(gpus), ", ".join(names)), exp, found)


def check_driver(ctx):
    gpus = ctx.gpus()
    versions = sorted({g.get("driver_version", "") for g in gpus})
    if not ctx.args.driver:
        return result("driver", "pass", "driver %s (no pinned version given)" % ",".join(versions), None, versions)
    want = strip_pkg_version(ctx.args.driver)
    if versions != [want]:
        return result("driver", "fail", "driver %s, pinned %s" % (",".join(versions) or "none", want), want, versions)
    return result("driver", "pass", "driver %s == pinned" % want, want, versions)


def _loaded_module(root):
    """(version, file) of the loaded NVIDIA kernel module, or None (not loaded, or no such file here)."""
    for rel in ("sys/module/nvidia/version", "proc/driver/nvidia/version"):
        path = os.path.join(root, rel)
        version = parse_nvrm_version(_read(path))
        if version:
            return version, path
    return None


def _installed_driver(ctx):
    """(version, source) of the installed NVIDIA kernel module: its package (dpkg), else `modinfo nvidia` (the module
    file a boot would load); None when neither knows one."""
    a = ctx.args
    patterns = [x for x in a.kmod_package.split(",") if x]
    rc, out, _ = ctx.run([a.dpkg_query, "-W", "-f", "${Package} ${db:Status-Abbrev} ${Version}\\n"] + patterns)
    pkgs = parse_dpkg_installed(out) if rc in (0, 1) else {}
    if pkgs:
        name = sorted(pkgs)[-1]
        return pkgs[name], "%s %s" % (name, pkgs[name])
    rc, out, _ = ctx.run([a.modinfo, "-F", "version", "nvidia"])
    version = parse_nvrm_version(out) if rc == 0 else None
    return (version, "modinfo nvidia") if version else None


def check_reboot(ctx):
    a = ctx.args
    path = a.reboot_required_file
    mark = (_read(path) or "") if os.path.exists(path) else None
    loaded = _loaded_module(a.sysfs_root)
    installed = _installed_driver(ctx)
    verdict = reboot_verdict(mark, path, _read(path + ".pkgs"), loaded, installed)
    found = {"reboot_required_file": mark is not None, "loaded": loaded and {"version": loaded[0], "source": loaded[1]},
             "installed": installed and {"version": installed[0], "source": installed[1]}}
    exp = {"reboot_required_file": False, "loaded": "the installed driver"}
    if verdict.reasons:
        return result("reboot", "fail", "; ".join(verdict.reasons), exp, found)
    if verdict.compared:
        return result("reboot", "pass", "no %s; loaded kernel module %s == installed driver (%s)"
                      % (path, loaded[0], installed[1]), exp, found)
    if not loaded:
        why = "no NVIDIA kernel module loaded"
    else:
        why = "installed driver unknown: no %s package, modinfo nvidia failed" % a.kmod_package
    return result("reboot", "pass", "no %s (loaded module not compared: %s)" % (path, why), exp, found)


def check_persistence(ctx):
    gpus = ctx.gpus()
    off = [g.get("index") for g in gpus if g.get("persistence_mode", "").lower() != "enabled"]
    if off:
        return result("persistence", "fail", "persistence mode off on GPU %s (is nvidia-persistenced running?)"
                      % ",".join(off), "Enabled", {g.get("index"): g.get("persistence_mode") for g in gpus})
    return result("persistence", "pass", "enabled on %d GPUs" % len(gpus), "Enabled", "Enabled")


def _fm_version(ctx):
    rc, out, err = ctx.run([ctx.args.fabricmanager_bin, "--version"])
    if rc == 127:
        return None
    m = re.search(r"version is\s*:?\s*([0-9][0-9.]+)", out + err) or re.search(r"([0-9]{3}\.[0-9]+\.[0-9]+)", out + err)
    return m.group(1) if m else ""


def _nvswitch_present(ctx, q):
    """True on NVSwitch (HGX) systems: a fabric state other than N/A, or an nvswitch device node."""
    for g in (q or {}).get("gpus", []):
        st = dig(g, "Fabric", "State")
        if st and st.upper() != "N/A":
            return True
    root = ctx.args.sysfs_root
    devdir = os.path.join(root, "dev")
    try:
        return any(n.startswith("nvidia-nvswitch") for n in os.listdir(devdir))
    except OSError:
        return False


def check_fabricmanager(ctx):
    a = ctx.args
    q = ctx.smi_q()
    gpus = ctx.gpus()
    drivers = sorted({g.get("driver_version", "") for g in gpus})
    nvswitch = _nvswitch_present(ctx, q)
    fm_ver = _fm_version(ctx)
    required = a.fabricmanager == "required" or (a.fabricmanager == "auto" and (nvswitch or fm_ver is not None))
    if a.fabricmanager == "off":
        return result("fabricmanager", "skip", "not checked (--fabricmanager off)", None,
                      {"nvswitch": nvswitch, "version": fm_ver})
    if not required:
        return result("fabricmanager", "skip", "no NVSwitch and no Fabric Manager installed", None,
                      {"nvswitch": nvswitch, "version": fm_ver})
    found = {"nvswitch": nvswitch, "version": fm_ver}
    exp = {"version": drivers[0] if drivers else None, "service": "active"}
    fabric_problem = None
    if nvswitch:
        qgpus = (q or {}).get("gpus", [])
        states = sorted({str(dig(g, "Fabric", "State")) for g in qgpus})
        statuses = sorted({str(dig(g, "Fabric", "Status")) for g in qgpus})
        found["fabric_state"], found["fabric_status"] = states, statuses
        exp["fabric"] = "Completed/Success"
        if states != ["Completed"] or statuses not in (["Success"], ["None"]):
            fabric_problem = "fabric state %s/%s, expected Completed/Success" % (",".join(states), ",".join(statuses))
    if fm_ver is None and nvswitch and fabric_problem is None and a.fabricmanager == "required":
        # required means checked here: a healthy fabric set up elsewhere is not Fabric Manager running on this node
        return result("fabricmanager", "fail", "required, but nv-fabricmanager is not on this host (the NVLink fabric "
                      "is Completed/Success: managed outside this OS? then --fabricmanager auto)", exp, found)
    if fm_ver is None and nvswitch and fabric_problem is None:
        # a guest with passed-through GPUs (shared-NVSwitch virtualization): Fabric Manager runs outside this OS and
        # the fabric it set up is healthy. Seen on the lent 2x H200 VM (driver 580.159.04).
        return result("fabricmanager", "warn", "Fabric Manager not on this host, but the NVLink fabric is "
                      "Completed/Success (managed outside this OS, e.g. by the hypervisor)", exp, found)
    problems = []
    if fm_ver is None:
        problems.append("nv-fabricmanager not installed")
    elif drivers and fm_ver != drivers[0]:
        problems.append("fabric manager version %s != driver %s" % (fm_ver or "unknown", drivers[0]))
    rc, out, _ = ctx.run(["systemctl", "is-active", a.fabricmanager_unit])
    state = out.strip() or ("unknown" if rc == 127 else "inactive")
    found["service"] = state
    if state != "active":
        problems.append("%s is %s" % (a.fabricmanager_unit, state))
        rc, jout, _ = ctx.run(["journalctl", "-u", a.fabricmanager_unit, "-n", "50", "--no-pager", "-o", "cat"])
        mm = [line for line in jout.splitlines() if "don't match" in line or "not match" in line]
        if mm:
            problems.append(mm[-1].strip()[:300])
    if fabric_problem:
        problems.append(fabric_problem)
    if problems:
        return result("fabricmanager", "fail", "; ".join(problems), exp, found)
    return result("fabricmanager", "pass", "fabric manager %s active" % fm_ver, exp, found)


def check_ecc(ctx):
    rc, out, err = ctx.smi("--query-gpu=" + ECC_FIELDS, "--format=csv,noheader,nounits")
    rows = parse_query_csv(out, ECC_FIELDS.split(",")) if rc == 0 else []
    found = {}
    problems = []
    if rows:
        for r in rows:
            idx = r.get("index")
            unc = r.get("ecc.errors.uncorrected.volatile.total", "")
            pend = r.get("remapped_rows.pending", "")
            fail = r.get("remapped_rows.failure", "")
            found[idx] = {"ecc_mode": r.get("ecc.mode.current"), "uncorrectable": unc,
                          "remap_pending": pend, "remap_failure": fail}
            if unc.isdigit() and int(unc) > 0:
                problems.append("GPU %s: %s uncorrectable ECC errors" % (idx, unc))
            if pend.lower() in ("yes", "1"):
                problems.append("GPU %s: row remap pending (reset the GPU)" % idx)
            if fail.lower() in ("yes", "1"):
                problems.append("GPU %s: row remap failed (RMA)" % idx)
    else:
        q = ctx.smi_q()
        if not q or not q.get("gpus"):
            return result("ecc", "fail", "cannot read ECC state: %s" % _first(err or out))
        for i, g in enumerate(q["gpus"]):
            unc = dig(g, "ECC Errors", "Volatile", "DRAM Uncorrectable") or dig(g, "ECC Errors", "Volatile",
                                                                               "Double Bit", "Total")
            pend = dig(g, "Remapped Rows", "Pending")
            fail = dig(g, "Remapped Rows", "Remapping Failure Occurred")
            found[str(i)] = {"uncorrectable": unc, "remap_pending": pend, "remap_failure": fail}
            if unc and unc.isdigit() and int(unc) > 0:
                problems.append("GPU %d: %s uncorrectable ECC errors" % (i, unc))
            if pend and pend.lower() == "yes":
                problems.append("GPU %d: row remap pending (reset the GPU)" % i)
            if fail and fail.lower() == "yes":
                problems.append("GPU %d: row remap failed (RMA)" % i)
    exp = {"uncorrectable": 0, "remap_pending": "No"}
    if problems:
        return result("ecc", "fail", "; ".join(problems), exp, found)
    return result("ecc", "pass", "no uncorrectable ECC errors, no pending row remaps", exp, found)


def read_kmsg(path):
    """All records currently in a kmsg device (non-blocking) or the whole of a kmsg-shaped file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    chunks = []
    try:
        is_dev = not os.path.isfile(path)
        while True:
            try:
                b = os.read(fd, 65536)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # record overwritten while reading: continue with the next
                    continue
                if exc.errno == errno.EINVAL:
                    break
                raise
            if not b:
                break
            chunks.append(b.decode("utf-8", "replace"))
            if is_dev and not chunks[-1].endswith("\n"):
                chunks.append("\n")
    finally:
        os.close(fd)
    return "".join(chunks)


def check_xid(ctx):
    a = ctx.args
    source, text = None, None
    errors = []
    for path in ([a.kmsg] if a.kmsg else ["/dev/kmsg"]):
        try:
            text, source = read_kmsg(path), path
        except OSError as exc:
            errors.append("%s: %s" % (path, exc.strerror or exc))
    if text is None and not a.kmsg:
        rc, out, err = ctx.run(["journalctl", "-k", "-b", "--no-pager", "-o", "short-monotonic"], timeout=60)
        if rc == 0:
            text, source = out, "journalctl -k"
        else:
            errors.append("journalctl -k: %s" % _first(err))
            rc, out, err = ctx.run(["dmesg"])
            if rc == 0:
                text, source = out, "dmesg"
            else:
                errors.append("dmesg: %s" % _first(err))
    if text is None:
        return result("xid", "fail", "cannot read the kernel log (%s)" % "; ".join(errors))
    xids = parse_xids(text)
    crit = [x for x in xids if x.code in CRITICAL_XIDS]
    found = {"source": source, "xids": [{"pci": x.pci, "xid": x.code, "detail": x.detail[:160]} for x in xids[-20:]]}
    if crit:
        summary = sorted({"%d on %s" % (x.code, x.pci) for x in crit})
        return result("xid", "fail", "critical XID %s in the kernel log" % ", ".join(summary), "no critical XID",
                      found)
    msg = "no critical XID (%d other XIDs)" % len(xids) if xids else "no XID in the kernel log"
    return result("xid", "pass", msg + " [%s]" % source, "no critical XID", found)


def check_nvlink(ctx):
    gpus = ctx.gpus()
    rc, out, err = ctx.smi("nvlink", "--status")
    if rc != 0:
        if len(gpus) <= 1:
            return result("nvlink", "skip", "single GPU: no NVLink peers (%s)" % _first(err or out))
        return result("nvlink", "fail", "nvidia-smi nvlink --status failed: %s" % _first(err or out))
    links = parse_nvlink_status(out)
    total = sum(len(v) for v in links.values())
    if total == 0:
        if len(gpus) <= 1:
            return result("nvlink", "skip", "single GPU: no NVLink reported", None, {"links": 0})
        return result("nvlink", "fail", "%d GPUs but no NVLink reported" % len(gpus), "all links active",
                      {"links": 0})
    inactive = {g: sorted(l for l, s in v.items() if s == "inactive") for g, v in links.items()}
    inactive = {g: v for g, v in inactive.items() if v}
    found = {"gpus": len(links), "links": total, "inactive": inactive}
    if len(gpus) <= 1 and len(inactive) == len(links):
        return result("nvlink", "skip", "single GPU: %d links, none active (no peer)" % total, None, found)
    if inactive:
        desc = "; ".join("GPU %s links %s" % (g, ",".join(map(str, l))) for g, l in sorted(inactive.items()))
        return result("nvlink", "fail", "inactive NVLinks: %s" % desc, "all links active", found)
    return result("nvlink", "pass", "%d links active on %d GPUs" % (total, len(links)), "all links active", found)


def _nccl_setting(a, var, given, flag):
    """(value, where it came from) of NCCL variable `var`: the command line, then the environment, then --nccl-conf
    (NCCL's own precedence); ("", None) when unset."""
    if given is not None:
        return given, flag
    if os.environ.get(var):
        return os.environ[var], "%s (environment)" % var
    conf = read_nccl_conf(a.nccl_conf)
    if conf.get(var):
        return conf[var], a.nccl_conf
    return "", None


def _ib_hca_setting(a):
    return _nccl_setting(a, "NCCL_IB_HCA", a.ib_hca, "--ib-hca")


def _read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def check_ib(ctx):
    a = ctx.args
    setting, source = _ib_hca_setting(a)
    if not setting:
        return result("ib", "skip", "NCCL_IB_HCA not set (no --ib-hca, environment or %s)" % a.nccl_conf)
    ibdir = os.path.join(a.sysfs_root, "sys/class/infiniband")
    try:
        present = sorted(os.listdir(ibdir))
    except OSError:
        present = []
    wanted, unmatched = select_ib_hcas(setting, present)  # [(hca, port|None)]
    problems = ["%s: no such HCA" % name for name in unmatched]
    ports_found = {}
    for hca, port in wanted:
        pdir = os.path.join(ibdir, hca, "ports")
        try:
            ports = [int(p) for p in os.listdir(pdir) if p.isdigit()]
        except OSError:
            ports = []
        for p in sorted(ports if port is None else [port]):
            base = os.path.join(pdir, str(p))
            raw = {n: _read(os.path.join(base, n)) for n in ("state", "phys_state", "rate", "link_layer")}
            key = "%s:%d" % (hca, p)
            ports_found[key] = raw
            if raw["state"] is None:
                problems.append("%s: port missing" % key)
                continue
            ib = parse_ib_sysfs({os.path.join(base, n): v for n, v in raw.items() if v is not None})[hca][p]
            if not ib.active:
                problems.append("%s: state %s" % (key, ib.state))
            if ib.phys_state is not None and not ib.link_up:
                problems.append("%s: phys_state %s" % (key, ib.phys_state))
            if a.ib_rate and ib.rate_gbps is not None and ib.rate_gbps < a.ib_rate and ib.active:
                problems.append("%s: rate %g Gb/s, expected %g" % (key, ib.rate_gbps, a.ib_rate))
    exp = {"hcas": setting, "state": "ACTIVE", "phys_state": "LinkUp", "rate_gbps": a.ib_rate}
    found = {"source": source, "ports": ports_found}
    if problems:
        return result("ib", "fail", "; ".join(problems), exp, found)
    if not ports_found:
        return result("ib", "fail", "no HCA port matches NCCL_IB_HCA=%s" % setting, exp, found)
    return result("ib", "pass", "%d ports ACTIVE at >= %s Gb/s" % (len(ports_found), a.ib_rate or "any"), exp, found)


def _socket_ifname_setting(a):
    return _nccl_setting(a, "NCCL_SOCKET_IFNAME", a.socket_ifname, "--socket-ifname")


def interface_up(net_dir, iface):
    """(up, state): operstate "up", or "unknown" with IFF_UP set (loopback, some virtual devices report unknown)."""
    state = _read(os.path.join(net_dir, iface, "operstate")) or "missing"
    flags = _read(os.path.join(net_dir, iface, "flags"))
    try:
        admin_up = bool(int(flags, 16) & 0x1) if flags else False
    except ValueError:
        admin_up = False
    return state == "up" or (state == "unknown" and admin_up), state


def check_socket_ifname(ctx):
    a = ctx.args
    setting, source = _socket_ifname_setting(a)
    if not setting:
        return result("socket_ifname", "skip", "NCCL_SOCKET_IFNAME not set (no --socket-ifname, environment or %s): "
                      "NCCL picks an interface itself" % a.nccl_conf)
    net_dir = a.net_dir
    try:
        present = sorted(os.listdir(net_dir))
    except OSError as exc:
        return result("socket_ifname", "fail", "cannot list network interfaces in %s: %s" % (net_dir, exc))
    chosen, unmatched = select_interfaces(setting, present)
    states = {}
    up = []
    for i in chosen:
        ok, state = interface_up(net_dir, i)
        states[i] = state
        if ok:
            up.append(i)
    exp = {"socket_ifname": setting, "state": "up"}
    found = {"source": source, "interfaces": present, "matching": states}
    if not chosen:
        return result("socket_ifname", "fail", "NCCL_SOCKET_IFNAME=%s matches no interface on this node (has: %s): "
                      "NCCL bootstrap would fail with \"Bootstrap : no socket interface found\""
                      % (setting, ", ".join(present) or "none"), exp, found)
    if not up:
        return result("socket_ifname", "fail", "NCCL_SOCKET_IFNAME=%s: %s not up (%s)" % (
            setting, ", ".join(chosen), ", ".join("%s %s" % (i, states[i]) for i in chosen)), exp, found)
    if unmatched:
        return result("socket_ifname", "warn", "NCCL_SOCKET_IFNAME=%s: %s up; no interface matches %s"
                      % (setting, ", ".join(up), ", ".join(unmatched)), exp, found)
    return result("socket_ifname", "pass", "NCCL_SOCKET_IFNAME=%s: %s up" % (setting, ", ".join(up)), exp, found)


def check_gpudirect(ctx):
    a = ctx.args
    root = a.sysfs_root
    modules = _read(os.path.join(root, "proc/modules")) or ""
    peermem = any(line.split(" ", 1)[0] == "nvidia_peermem" for line in modules.splitlines()) or \
        os.path.isdir(os.path.join(root, "sys/module/nvidia_peermem"))
    ver = _read(os.path.join(root, "proc/driver/nvidia/version"))
    if ver is not None:
        open_km, km_source = "Open Kernel Module" in ver, "/proc/driver/nvidia/version"
    else:
        # no loaded-module report (module not loaded yet, or a container): the installed DKMS package tells
        rc, out, _ = ctx.run(["dpkg-query", "-W", "-f", "${Package} ${db:Status-Abbrev}\\n", "nvidia-kernel-open-*"])
        open_km = rc == 0 and any(line.split()[1:2] == ["ii"] for line in out.splitlines())
        km_source = "dpkg (nvidia-kernel-open installed)" if open_km else "none"
    rel = (_read(os.path.join(root, "proc/sys/kernel/osrelease")) if root != "/" else None) or os.uname().release
    m = re.match(r"(\d+)\.(\d+)", rel)
    kernel_ok = bool(m) and (int(m.group(1)), int(m.group(2))) >= (5, 12)
    dmabuf = open_km and kernel_ok
    found = {"nvidia_peermem": peermem, "open_kernel_module": open_km, "module_source": km_source, "kernel": rel,
             "dmabuf": dmabuf}
    if peermem or dmabuf:
        how = "nvidia-peermem loaded" if peermem else "DMA-BUF (open kernel modules, kernel %s)" % rel
        return result("gpudirect", "pass", how, "nvidia-peermem or DMA-BUF", found)
    setting, _ = _ib_hca_setting(a)
    if not setting:
        return result("gpudirect", "skip", "no RDMA HCA configured; GPUDirect RDMA not available either",
                      "nvidia-peermem or DMA-BUF", found)
    return result("gpudirect", "fail", "neither nvidia-peermem loaded nor DMA-BUF usable (open driver: %s, kernel %s)"
                  % (open_km, rel), "nvidia-peermem or DMA-BUF", found)


def _iommu(root):
    cmdline = _read(os.path.join(root, "proc/cmdline"))
    gdir = os.path.join(root, "sys/kernel/iommu_groups")
    try:
        groups = os.listdir(gdir)
    except OSError:
        groups = []
    types = [_read(os.path.join(gdir, g, "type")) or "" for g in groups]
    return iommu_mode(cmdline, types)


def check_acs(ctx):
    """ACS redirect off on every bridge above a GPU/HCA. Under a --sysfs-root other than / (the simulated rack, a
    replay) the PCI tree is <root>/lspci (what `lspci -D -vvv` printed); on the node itself lspci runs."""
    a = ctx.args
    root = a.sysfs_root
    exp = "ACS redirect off on the PCIe bridges above GPUs and HCAs (GPUDirect P2P/RDMA)"
    if root != "/":
        text = _read(os.path.join(root, "lspci"))
        if text is None:
            return result("acs", "skip", "no %s (what lspci -D -vvv prints)" % os.path.join(root, "lspci"), exp)
    else:
        rc, text, err = ctx.run([a.lspci, "-D", "-vvv"])
        if rc == 127:
            return result("acs", "skip", "lspci not installed (pciutils)", exp)
        if rc != 0:
            return result("acs", "fail", "lspci failed (rc %d): %s" % (rc, _first(err or text)), exp)
    funcs = parse_lspci(text)
    mode, why = _iommu(root)
    bridges = [f for f in funcs if f.is_bridge and f.acs is not None]
    found = {"bridges_with_acs": len(bridges), "redirect": [], "iommu": mode, "iommu_source": why}
    redirects = acs_redirects(funcs)
    if redirects:
        found["redirect"] = [{"bridge": r.bridge, "below": [d[1] for d in r.devices]} for r in redirects]
        return result("acs", "fail", acs_message(redirects), exp, found)
    if not bridges and acs_unreadable(funcs):
        return result("acs", "skip", "lspci shows no capabilities without root: ACS not readable", exp, found)
    if mode == "translated":
        return result("acs", "warn", "ACS redirect off on %d bridges; IOMMU translated (%s): GPUDirect RDMA wants "
                      "it off or iommu=pt" % (len(bridges), why), exp, found)
    return result("acs", "pass", "ACS redirect off on %d bridges; IOMMU %s" % (len(bridges), mode), exp, found)


# ----------------------------------------------------------------------------------------------------- node shapes
def _present(ctx, prog):
    """prog itself when it runs here (a path or on PATH), else None."""
    return prog if (os.path.isabs(prog) and os.access(prog, os.X_OK)) or shutil.which(prog) else None


def check_efa(ctx):
    """AWS EFA: every expected device is in sysfs (rdmap*, port ACTIVE) and in `fi_info -p efa` (what aws-ofi-nccl
    opens). Skipped unless --efa-devices N (the inventory's efa_device_count on fabric efa)."""
    a = ctx.args
    if not a.efa_devices:
        return result("efa", "skip", "no EFA devices expected (--efa-devices)")
    want_names = [x for x in (a.efa_names or "").split(",") if x]
    exp = {"devices": a.efa_devices, "names": want_names or None, "state": "ACTIVE"}
    ibdir = os.path.join(a.sysfs_root, "sys/class/infiniband")
    try:
        sysfs = sorted(n for n in os.listdir(ibdir) if n.startswith("rdmap"))
    except OSError:
        sysfs = []
    problems = []
    active = []
    for dev in sysfs:
        base = os.path.join(ibdir, dev, "ports", "1")
        raw = {n: _read(os.path.join(base, n)) for n in ("state", "phys_state", "rate", "link_layer")}
        port = parse_ib_sysfs({os.path.join(base, n): v for n, v in raw.items() if v is not None}).get(dev, {}).get(1)
        if port is not None and port.active:
            active.append(dev)
        else:
            problems.append("%s: port state %s" % (dev, port.state if port else "missing"))
    fi = _present(ctx, a.fi_info) or _present(ctx, "/opt/amazon/efa/bin/fi_info")
    if fi is None:
        problems.append("fi_info not found (%s, /opt/amazon/efa/bin/fi_info): is the EFA software installed?"
                        % a.fi_info)
        libfabric = []
    else:
        rc, out, err = ctx.run([fi, "-p", "efa", "-t", "FI_EP_RDM"])
        libfabric = efa_devices(parse_fi_info(out))
        if not libfabric:
            problems.append("fi_info -p efa lists no EFA device (rc %d: %s)" % (rc, _first(out or err)))
    found = {"sysfs": sysfs, "active": active, "fi_info": libfabric}
    if len(active) < a.efa_devices:
        problems.insert(0, "%d of %d EFA devices ACTIVE in sysfs" % (len(active), a.efa_devices))
    if fi is not None and libfabric and len(libfabric) < a.efa_devices:
        problems.append("fi_info -p efa lists %d of %d EFA devices" % (len(libfabric), a.efa_devices))
    missing = [n for n in want_names if n not in active or (fi is not None and n not in libfabric)]
    if missing:
        problems.append("missing or down: %s" % ",".join(missing))
    if problems:
        return result("efa", "fail", "; ".join(problems), exp, found)
    return result("efa", "pass", "%d EFA devices ACTIVE and listed by fi_info" % len(active), exp, found)


def check_nvlsm(ctx):
    """HGX B200/B300: NVLSM (the NVLink subnet manager) runs, with mlx5_ib and ib_umad loaded; without it Fabric
    Manager cannot finish the fabric (state In Progress, CUDA SYSTEM_NOT_READY: the fabricmanager check)."""
    a = ctx.args
    if a.nvlsm == "off":
        return result("nvlsm", "skip", "not checked (--nvlsm off)")
    installed = _present(ctx, a.nvlsm_bin)
    if a.nvlsm == "auto" and not installed:
        return result("nvlsm", "skip", "NVLSM not installed (not an NVLSM model)")
    exp = {"service": "active", "modules": ["mlx5_ib", "ib_umad"]}
    rc, out, _ = ctx.run(["systemctl", "is-active", a.nvlsm_unit])
    state = out.strip() or ("unknown" if rc == 127 else "inactive")
    mods = set()
    text = _read(os.path.join(a.sysfs_root, "proc/modules")) or _read("/proc/modules") or ""
    for line in text.splitlines():
        mods.add(line.split(" ", 1)[0])
    found = {"service": state, "installed": bool(installed),
             "modules": sorted(m for m in ("mlx5_ib", "ib_umad") if m in mods)}
    problems = []
    if not installed:
        problems.append("nvlsm not installed (%s)" % a.nvlsm_bin)
    if state != "active":
        problems.append("%s is %s: Fabric Manager cannot bring the NVLink fabric up" % (a.nvlsm_unit, state))
    if mods and len(found["modules"]) < 2:
        problems.append("kernel modules not loaded: %s" % ",".join(m for m in ("mlx5_ib", "ib_umad") if m not in mods))
    if problems:
        return result("nvlsm", "fail", "; ".join(problems), exp, found)
    return result("nvlsm", "pass", "%s active" % a.nvlsm_unit, exp, found)


def check_imex(ctx):
    """GB200/GB300 NVL72 trays: the IMEX daemon runs, `nvidia-imex-ctl -N` reports the domain UP with every tray
    READY and connected, and IMEX channel 0 exists."""
    a = ctx.args
    if a.imex == "off":
        return result("imex", "skip", "not checked (--imex off)")
    ctl = _present(ctx, a.imex_ctl)
    if a.imex == "auto" and not ctl:
        return result("imex", "skip", "nvidia-imex-ctl not installed (not an IMEX model)")
    exp = {"domain": "UP", "nodes": a.imex_nodes, "channel": os.path.join(a.imex_channel_dir, "channel0")}
    problems = []
    found = {}
    rc, out, _ = ctx.run(["systemctl", "is-active", a.imex_unit])
    found["service"] = out.strip() or ("unknown" if rc == 127 else "inactive")
    if found["service"] != "active":
        problems.append("%s is %s" % (a.imex_unit, found["service"]))
    if not ctl:
        problems.append("nvidia-imex-ctl not installed (%s)" % a.imex_ctl)
    else:
        rc, out, err = ctx.run([ctl, "-N"])
        dom = parse_imex_ctl(out)
        found["domain"] = dom.state
        found["nodes"] = {n.address: n.status for n in dom.nodes}
        if dom.state != "UP":
            bad = [n.address for n in dom.nodes if n.status != "READY"]
            problems.append("IMEX domain %s%s" % (dom.state or "unknown (rc %d: %s)" % (rc, _first(err or out)),
                                                  ": not ready %s" % ",".join(bad) if bad else ""))
        elif dom.unconnected():
            pairs = ["%s->%s %s" % (dom.nodes[f].address if f < len(dom.nodes) else f,
                                    dom.nodes[t].address if t < len(dom.nodes) else t, c)
                     for f, t, c in dom.unconnected()[:6]]
            problems.append("IMEX links not connected: %s" % ", ".join(pairs))
        if a.imex_nodes and dom.nodes and len(dom.nodes) != a.imex_nodes:
            problems.append("IMEX domain has %d nodes, expected %d (nodes_config.cfg)" % (len(dom.nodes), a.imex_nodes))
    chan = os.path.join(a.imex_channel_dir, "channel0")
    found["channel0"] = os.path.exists(chan)
    if not found["channel0"]:
        problems.append("%s missing (NVreg_CreateImexChannel0=1 not in effect)" % chan)
    if problems:
        return result("imex", "fail", "; ".join(problems), exp, found)
    return result("imex", "pass", "IMEX domain UP, %d nodes READY, channel0 present" % len(found.get("nodes", {})),
                  exp, found)

# ---- all-reduce
_TORCH_WORKER = r'''
import json, os, sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp


def parse_size(s):
    s = s.strip().upper(); mult = 1
    for suf, m in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if s.endswith(suf): mult, s = m, s[:-1]
    return int(float(s) * mult)

def worker(rank, n, port, sizes, iters, warmup, q):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=n)
    res = []
    try:
        for nbytes in sizes:
            numel = nbytes // 2
            x = torch.full((numel,), float(rank + 1), dtype=torch.bfloat16, device="cuda")
            for _ in range(warmup):
                dist.all_reduce(x)
            torch.cuda.synchronize(); dist.barrier()
            x.fill_(float(rank + 1))
            dist.all_reduce(x)
            torch.cuda.synchronize()
            ok = float(x[0].item()) == float(n * (n + 1) // 2) and float(x[-1].item()) == float(n * (n + 1) // 2)
            dist.barrier()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(iters):
                dist.all_reduce(x)
            e.record(); torch.cuda.synchronize()
            sec = s.elapsed_time(e) / 1000.0 / iters
            algbw = nbytes / sec / 1e9
            res.append({"bytes": nbytes, "time_us": sec * 1e6, "algbw_gbps": algbw,
                        "busbw_gbps": algbw * 2 * (n - 1) / n, "correct": ok})
            del x; torch.cuda.empty_cache()
        if rank == 0:
            q.put(res)
    finally:
        dist.destroy_process_group()

if __name__ == "__main__":
    n, port, iters, warmup = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[4]), int(sys.argv[5])
    sizes = [parse_size(s) for s in sys.argv[3].split(",")]
    ctx = mp.get_context("spawn"); q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, n, port, sizes, iters, warmup, q)) for r in range(n)]
    for p in procs: p.start()
    res = None
    try:
        res = q.get(timeout=float(os.environ.get("NODE_HEALTH_AR_TIMEOUT", "300")))
    finally:
        for p in procs: p.join(timeout=30)
    bad = [p.exitcode for p in procs if p.exitcode]
    print(json.dumps({"results": res, "world_size": n, "torch": torch.__version__,
                      "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                      "device": torch.cuda.get_device_name(0), "exitcodes": bad}))
'''


def parse_size(s):
    s = s.strip().upper()
    mult = 1
    for suf, m in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if s.endswith(suf):
            mult, s = m, s[:-1]
    return int(float(s) * mult)


def parse_nccl_tests(text):
    """all_reduce_perf output -> (rows [(bytes, algbw, busbw)], avg busbw). Out-of-place columns."""
    rows = []
    avg = None
    for line in text.splitlines():
        m = re.search(r"Avg bus bandwidth\s*:\s*([0-9.]+)", line)
        if m:
            avg = float(m.group(1))
            continue
        if line.lstrip().startswith("#"):
            continue
        f = line.split()
        if len(f) >= 8 and f[0].isdigit():
            try:
                rows.append((int(f[0]), float(f[6]), float(f[7])))
            except ValueError:
                pass
    return rows, avg


def _find_torch_python(a):
    cands = [a.torch_python] if a.torch_python else [sys.executable, "/opt/vllm/venv/bin/python", "python3"]
    for c in cands:
        exe = c if os.sep in c else shutil.which(c)
        if not exe or not os.access(exe, os.X_OK):
            continue
        try:
            p = subprocess.run([exe, "-c", "import torch,sys; sys.exit(0 if torch.cuda.is_available() and "
                                "torch.distributed.is_nccl_available() else 3)"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if p.returncode == 0:
            return exe
    return None


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def check_allreduce(ctx):
    a = ctx.args
    if a.allreduce == "off":
        return result("allreduce", "skip", "turned off (--allreduce off)")
    # Without --busbw-min the figure is still measured when possible and reported, not gated.
    try:
        ngpu = len(ctx.gpus())
    except CheckError:
        ngpu = 0
    if ngpu == 0:
        return result("allreduce", "fail" if a.allreduce == "required" else "skip", "no GPU to test")
    sizes = a.allreduce_sizes
    nccl_tests = a.nccl_tests or shutil.which("all_reduce_perf")
    exp = {"busbw_min_gbps": a.busbw_min, "bytes": parse_size(sizes.split(",")[-1])}
    found = {"gpus": ngpu}
    if ngpu < 2 and a.allreduce == "required":
        # required = a bus bandwidth is measured (and gated when --busbw-min is set): impossible on one GPU
        return result("allreduce", "fail", "required, but 1 GPU: bus bandwidth needs >= 2 GPUs%s" % (
            " (--busbw-min %g cannot be checked)" % a.busbw_min if a.busbw_min is not None else ""), exp, found)
    if nccl_tests and os.access(nccl_tests, os.X_OK):
        lo, hi = sizes.split(",")[0], sizes.split(",")[-1]
        rc, out, err = ctx.run([nccl_tests, "-b", lo, "-e", hi, "-f", "2", "-g", str(ngpu), "-n", str(a.allreduce_iters)],
                               timeout=a.allreduce_timeout)
        rows, _avg = parse_nccl_tests(out)
        if rc != 0 or not rows:
            return result("allreduce", "fail", "all_reduce_perf failed (rc %d): %s" % (rc, _first(err or out)),
                          exp, found)
        found.update({"tool": "nccl-tests", "sizes": [{"bytes": b, "algbw_gbps": al, "busbw_gbps": bu}
                                                       for b, al, bu in rows]})
        busbw = rows[-1][2]
        algbw = rows[-1][1]
    else:
        py = _find_torch_python(a)
        if not py:
            st = "fail" if a.allreduce == "required" else "skip"
            return result("allreduce", st, "neither nccl-tests (all_reduce_perf) nor torch with CUDA/NCCL found", exp,
                          found)
        fd, path = tempfile.mkstemp(prefix="node_health_ar_", suffix=".py")
        with os.fdopen(fd, "w") as f:
            f.write(_TORCH_WORKER)
        try:
            env = dict(os.environ, NODE_HEALTH_AR_TIMEOUT=str(a.allreduce_timeout))
            try:
                p = subprocess.run([py, path, str(ngpu), str(_free_port()), sizes, str(a.allreduce_iters),
                                    str(a.allreduce_warmup)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   timeout=a.allreduce_timeout + 60, universal_newlines=True, env=env)
            except subprocess.TimeoutExpired:
                return result("allreduce", "fail", "torch all-reduce timed out after %ds" % a.allreduce_timeout,
                              exp, found)
        finally:
            os.unlink(path)
        data = None
        for line in reversed(p.stdout.splitlines()):
            if line.startswith("{"):
                try:
                    data = json.loads(line)
                    break
                except ValueError:
                    pass
        if p.returncode != 0 or not data or not data.get("results"):
            return result("allreduce", "fail", "torch all-reduce failed (rc %d): %s"
                          % (p.returncode, _first(p.stderr[-2000:]) or _first(p.stdout)), exp, found)
        found.update({"tool": "torch.distributed/nccl", "torch": data.get("torch"), "nccl": data.get("nccl"),
                      "device": data.get("device"),
                      "sizes": [{k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()}
                                for r in data["results"]]})
        if not all(r.get("correct") for r in data["results"]):
            return result("allreduce", "fail", "all-reduce returned a wrong sum", exp, found)
        busbw = data["results"][-1]["busbw_gbps"]
        algbw = data["results"][-1]["algbw_gbps"]
    found["busbw_gbps"] = round(busbw, 2)
    found["algbw_gbps"] = round(algbw, 2)
    if ngpu < 2:
        # NCCL's all-reduce on one rank is a no-op (no peer, in place): its time is launch overhead, so no
        # bandwidth figure is meaningful. The run still proves torch + NCCL + the GPU work and the sum is right.
        return result("allreduce", "skip", "1 GPU: NCCL all-reduce path works (sum correct); bus bandwidth needs "
                      ">= 2 GPUs%s" % (" (--busbw-min %g not checked)" % a.busbw_min if a.busbw_min is not None
                                      else ""), exp, found)
    if a.busbw_min is not None and busbw < a.busbw_min:
        return result("allreduce", "fail", "all-reduce busbw %.1f GB/s < %.1f GB/s (%d GPUs, %s)"
                      % (busbw, a.busbw_min, ngpu, sizes.split(",")[-1]), exp, found)
    return result("allreduce", "pass", "all-reduce busbw %.1f GB/s on %d GPUs (%s)" % (
        busbw, ngpu, "min %.1f" % a.busbw_min if a.busbw_min is not None else "no minimum set: reported only"),
                  exp, found)


CHECK_FUNCS = {
    "gpu": check_gpu, "driver": check_driver, "reboot": check_reboot, "persistence": check_persistence, "fabricmanager": check_fabricmanager,
    "ecc": check_ecc, "xid": check_xid, "nvlink": check_nvlink, "ib": check_ib, "socket_ifname": check_socket_ifname,
    "gpudirect": check_gpudirect, "acs": check_acs, "efa": check_efa, "nvlsm": check_nvlsm, "imex": check_imex,
    "allreduce": check_allreduce,
}


# ----------------------------------------------------------------------------------------------------- watch
#: The checks whose failure is a fatal signal (the alert rules' provisioner_node_fault{signal}), in watch mode.
WATCH_CHECKS = ("xid", "ecc", "nvlink", "ib", "fabricmanager")


def fault_metrics(results, now):
    """The textfile for node_exporter: one provisioner_node_fault per check run (1 when it failed), the fatal XID
    codes seen in the kernel log, and when this was measured. Only integers and check names become label values."""
    lines = ["# HELP provisioner_node_fault 1 when this fault check fails on the node (node_health.py --watch).",
             "# TYPE provisioner_node_fault gauge"]
    xids = {}
    for r in results:
        lines.append('provisioner_node_fault{signal="%s"} %d' % (r["check"], 1 if r["status"] == "fail" else 0))
        if r["check"] == "xid":
            for x in (r.get("found") or {}).get("xids", []):
                if isinstance(x.get("xid"), int) and x["xid"] in CRITICAL_XIDS:
                    xids[x["xid"]] = xids.get(x["xid"], 0) + 1
    lines += ["# HELP provisioner_node_xid_fatal Fatal-class XID records of this code in the kernel log.",
              "# TYPE provisioner_node_xid_fatal gauge"]
    lines += ['provisioner_node_xid_fatal{xid="%d"} %d' % (code, n) for code, n in sorted(xids.items())]
    lines += ["# HELP provisioner_node_watch_timestamp_seconds When the fault checks last ran.",
              "# TYPE provisioner_node_watch_timestamp_seconds gauge",
              "provisioner_node_watch_timestamp_seconds %d" % int(now)]
    return "\n".join(lines) + "\n"


def write_atomic(path, text):
    """Temporary file in the same directory + rename: node_exporter never reads half a file."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".node_watch.", dir=d)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def watch(args):
    """Run the fault checks every --watch seconds, rewriting --textfile; --watch-count bounds the rounds (tests)."""
    if not args.only:
        args.only = list(WATCH_CHECKS)
    rounds = 0
    while True:
        t0 = time.monotonic()
        write_atomic(args.textfile, fault_metrics(run_checks(args), time.time()))
        rounds += 1
        if args.watch_count and rounds >= args.watch_count:
            return 0
        time.sleep(max(0.0, args.watch - (time.monotonic() - t0)))


# ----------------------------------------------------------------------------------------------------- main
def build_parser():
    p = argparse.ArgumentParser(prog="node_health.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Exit status: 0 every check passed or was skipped, 1 a check failed, 2 usage.")
    p.add_argument("--gpu-count", type=int, help="expected number of GPUs")
    p.add_argument("--gpu-name", action="append", default=[],
                   help="accepted nvidia-smi product name (repeatable), e.g. 'NVIDIA H100 80GB HBM3'")
    p.add_argument("--driver", help="pinned driver version (580.95.05 or the package version 580.95.05-1)")
    p.add_argument("--reboot-required-file", default=REBOOT_REQUIRED_FILE,
                   help="the reboot-pending mark (default %s): its presence fails the reboot check" % REBOOT_REQUIRED_FILE)
    p.add_argument("--kmod-package", default="nvidia-kernel-open-*,nvidia-dkms-*",
                   help="dpkg patterns of the NVIDIA kernel module package (comma list): the installed driver")
    p.add_argument("--dpkg-query", default="dpkg-query")
    p.add_argument("--modinfo", default="modinfo", help="modinfo (used when no kernel module package is installed)")
    p.add_argument("--fabricmanager", choices=("auto", "required", "off"), default="auto",
                   help="auto: checked when an NVSwitch fabric or nv-fabricmanager is present (default); required: "
                   "nv-fabricmanager must run on this node, fails when it cannot be checked")
    p.add_argument("--fabricmanager-unit", default="nvidia-fabricmanager")
    p.add_argument("--fabricmanager-bin", default="nv-fabricmanager")
    p.add_argument("--kmsg", help="kernel log: a kmsg device or kmsg-shaped file (default /dev/kmsg, then journalctl -k)")
    p.add_argument("--ib-hca", help="NCCL_IB_HCA value to check (default: environment, then --nccl-conf)")
    p.add_argument("--nccl-conf", default="/etc/nccl.conf")
    p.add_argument("--ib-rate", type=float, default=400.0, help="expected IB port rate in Gb/s (default 400)")
    p.add_argument("--socket-ifname", help="NCCL_SOCKET_IFNAME value to check (default: environment, then --nccl-conf)")
    p.add_argument("--net-dir", default="/sys/class/net",
                   help="where the node's network interfaces are listed (default /sys/class/net)")
    p.add_argument("--sysfs-root", default="/", help="root under which sys/class/infiniband, proc/ and dev/ are read")
    p.add_argument("--efa-devices", type=int, default=0,
                   help="expected EFA devices (rdmap*) on fabric efa; 0: check skipped")
    p.add_argument("--efa-names", help="comma list of the EFA devices that must be present (optional)")
    p.add_argument("--fi-info", default="fi_info", help="libfabric's fi_info (default: PATH, then /opt/amazon/efa/bin)")
    p.add_argument("--nvlsm", choices=("auto", "required", "off"), default="auto",
                   help="NVLSM (HGX B200/B300): required, auto (checked where installed), off")
    p.add_argument("--nvlsm-unit", default="nvlsm")
    p.add_argument("--nvlsm-bin", default="nvlsm")
    p.add_argument("--imex", choices=("auto", "required", "off"), default="auto",
                   help="IMEX (GB200/GB300 NVL72 trays): required, auto (checked where installed), off")
    p.add_argument("--imex-unit", default="nvidia-imex")
    p.add_argument("--imex-ctl", default="nvidia-imex-ctl")
    p.add_argument("--imex-nodes", type=int, default=0, help="trays the IMEX domain must list (0: not checked)")
    p.add_argument("--imex-channel-dir", default="/dev/nvidia-caps-imex-channels")
    p.add_argument("--allreduce", choices=("auto", "required", "off"), default="auto",
                   help="auto: run when nccl-tests or torch+CUDA is present and the node has >= 2 GPUs, skip "
                   "otherwise; required: fail when it cannot run (no GPU, 1 GPU, no tool)")
    p.add_argument("--busbw-min", type=float, help="minimum all-reduce bus bandwidth, GB/s (per GPU model and count)")
    p.add_argument("--allreduce-sizes", default="4G", help="comma list of message sizes; the last one is gated")
    p.add_argument("--allreduce-iters", type=int, default=20)
    p.add_argument("--allreduce-warmup", type=int, default=5)
    p.add_argument("--allreduce-timeout", type=int, default=300)
    p.add_argument("--nccl-tests", help="path to all_reduce_perf (default: on PATH)")
    p.add_argument("--torch-python", help="python with torch for the all-reduce (default: this one, "
                   "/opt/vllm/venv/bin/python, python3)")
    p.add_argument("--nvidia-smi", default="nvidia-smi")
    p.add_argument("--lspci", default="lspci", help="pciutils' lspci (the acs check; run only with --sysfs-root /)")
    p.add_argument("--only", action="append", choices=CHECKS, help="run only these checks (repeatable)")
    p.add_argument("--skip", action="append", default=[], choices=CHECKS, help="skip these checks (repeatable)")
    p.add_argument("--format", choices=("jsonl", "text"), default="jsonl")
    p.add_argument("--output", help="also write the JSON results (one document) to this file")
    p.add_argument("--watch", type=float, metavar="SECONDS",
                   help="watch mode: run the fault checks every SECONDS and rewrite --textfile (until stopped)")
    p.add_argument("--textfile", help="watch mode: node_exporter textfile collector file (e.g. "
                   "/var/lib/prometheus/node-exporter/provisioner_node_watch.prom)")
    p.add_argument("--watch-count", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--version", action="version", version="node_health " + VERSION)
    return p


def run_checks(args):
    ctx = Ctx(args)
    names = [c for c in (args.only or CHECKS) if c not in args.skip]
    out = []
    for name in names:
        t0 = time.monotonic()
        try:
            r = CHECK_FUNCS[name](ctx)
        except CheckError as exc:
            r = result(name, "fail", str(exc))
        except Exception as exc:  # a check must never take the others down
            r = result(name, "fail", "check crashed: %s: %s" % (type(exc).__name__, exc))
        r["seconds"] = round(time.monotonic() - t0, 3)
        out.append(r)
    return out


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.watch is None) != (args.textfile is None) or (args.watch is not None and args.watch <= 0):
        parser.error("--watch SECONDS (> 0) and --textfile FILE go together")
    if args.watch is not None:
        try:
            return watch(args)
        except KeyboardInterrupt:
            return 0
    results = run_checks(args)
    failed = [r["check"] for r in results if r["status"] == "fail"]
    summary = {"check": "summary", "status": "fail" if failed else "pass", "failed": failed,
               "host": socket.gethostname(), "version": VERSION, "time": int(time.time())}
    if args.format == "jsonl":
        for r in results + [summary]:
            print(json.dumps(r, sort_keys=False))
    else:
        for r in results:
            print("%-14s %-5s %s" % (r["check"], r["status"].upper(), r["message"]))
        print("%-14s %-5s %s" % ("summary", summary["status"].upper(), ", ".join(failed) or "all checks passed"))
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"results": results, "summary": summary}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
