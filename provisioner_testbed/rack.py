"""A simulated rack's lifecycle: up (idempotent, repairs stopped hosts), down (complete, also after a crash),
reset (hosts back to a fresh disk), stop/start of one host, live hardware faults, status.

Callers: `provisioner/commands/testbed.py` (CLI) and `tests/testbed/conftest.py`. Everything here needs root.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provisioner.errors import UsageError
from provisioner_testbed import hosts as hostmod
from provisioner_testbed import inventory_writer as invw
from provisioner_testbed import network, proxy, rootfs, serve
from provisioner_testbed.state import (
    NAME_RE,
    HostState,
    Proc,
    RackState,
    children,
    pids_with_arg_under,
    rack_dir,
    rack_names,
    racks_dir,
    terminate,
)

Log = Callable[[str], None]
DEFAULT_NAME = "rack"
DEFAULT_NODES = 4
MAX_NODES = 64
MAX_BALANCERS = 4
SSH_TIMEOUT_BASE = 60.0
SSH_TIMEOUT_PER_HOST = 6.0


def _nolog(_: str) -> None:
    pass


def require_root() -> None:
    if os.geteuid() != 0:
        raise UsageError(
            "provision testbed needs root (it mounts overlayfs, creates a bridge and boots systemd-nspawn hosts): "
            "run it as root, e.g. with sudo"
        )


def check_name(name: str) -> None:
    if not NAME_RE.match(name):
        raise UsageError(f"rack name {name!r}: use 1-16 lowercase letters, digits or '-', starting with a letter")


@dataclass(frozen=True)
class UpOptions:
    name: str = DEFAULT_NAME
    nodes: int = DEFAULT_NODES
    spec_file: Path | None = None
    with_vllm: bool = False
    # vLLM cluster groups in the inventory; None: only with the vLLM layer (a plain rack cannot serve vLLM, so its
    # default inventory declares no cluster and a plain run/drift of `make demo`'s rack is clean)
    clusters: bool | None = None
    # plain hosts after the nodes (lb01..): the inventory puts them in group `lb` (the serving edge), not gpu_nodes
    balancers: int = 0

    @property
    def want_clusters(self) -> bool:
        return self.with_vllm if self.clusters is None else self.clusters


@dataclass(frozen=True)
class UpResult:
    rack: RackState
    created: bool  # False: it was already up (no-op) or only repaired
    repaired: tuple[str, ...]
    seconds: float


# ---------------------------------------------------------------------------------------------------------------
# hardware specs


def _spec_doc(spec_file: Path | None) -> dict[str, Any]:
    if spec_file is None:
        return {}
    from provisioner_testbed import hwspec

    if not spec_file.is_file():
        raise UsageError("hardware spec file not found", path=str(spec_file))
    return hwspec.load(spec_file)


#: A `--with-vllm` rack runs one CPU vLLM rank per host (TP 1): its hosts simulate one GPU each unless the spec
#: says otherwise, so the inventory's GPU count matches the clusters' TP x PP (rule CL003).
VLLM_RACK_GPUS = 1


def host_input_specs(spec_file: Path | None, names: list[str], *, with_vllm: bool = False
                     ) -> dict[str, dict[str, Any]]:
    """Each host's spec as written (rack defaults + its overrides), validated (UsageError on a bad spec)."""
    from provisioner_testbed import hwspec

    doc = _spec_doc(spec_file)
    if isinstance(doc.get("hosts"), dict):
        unknown = sorted(set(doc["hosts"]) - set(names))
        if unknown:
            raise UsageError(f"hardware spec names host {unknown[0]!r}, not in this rack ({names[0]}..{names[-1]})",
                             path=str(spec_file))
    out = {}
    for n in names:
        s = hwspec.for_host(doc, n)
        if with_vllm:
            s.setdefault("gpu_count", VLLM_RACK_GPUS)
        hwspec.resolve(s)  # validate now, before anything is created
        out[n] = s
    return out


def materialize(hp: hostmod.HostPaths, spec: dict[str, Any]) -> dict[str, Any]:
    """Resolve + write the host's hardware dir (in place, so a running host sees it live). The loaded NVIDIA module
    is the one the host last booted with (`onboot`), unless the spec sets one."""
    from provisioner_testbed import hwspec
    from provisioner_testbed.onboot import effective_spec, loaded_module

    resolved = hwspec.resolve(effective_spec(spec, loaded_module(hp.root)))
    hp.hwsim.mkdir(parents=True, exist_ok=True)
    try:
        from provisioner_testbed.hwsim import materialize as hw_materialize  # type: ignore[attr-defined]
    except ImportError:
        hw_materialize = None
    if hw_materialize is not None:
        hw_materialize(resolved, hp.hwsim)
    else:  # the simulator is not there yet: at least the spec
        _write_in_place(hp.hwsim / "spec.json", json.dumps(resolved, indent=2) + "\n")
    _write_in_place(hp.spec, json.dumps(spec, indent=2) + "\n")
    return resolved


def _write_in_place(p: Path, text: str) -> None:
    with open(p, "w") as fh:  # same inode: overlay/bind mounts inside the host see the new content
        fh.write(text)


def _inv_host(h: HostState, spec: dict[str, Any]) -> invw.InvHost:
    """What the inventory declares for a host: its intended hardware (the spec without faults)."""
    from provisioner_testbed import hwspec

    clean = {k: v for k, v in spec.items() if k != "faults"}
    r = hwspec.resolve(clean)
    return invw.InvHost(name=h.name, address=h.address, gpu_model=r["gpu_model"], gpu_count=len(r["gpus"]),
                        ib_hcas=tuple(x["name"] for x in r["hcas"]), efa_devices=len(r["efa"]),
                        nvlink_domain=invw.NVL72_DOMAIN if r["imex"] else None,
                        group=invw.LB_GROUP if h.role == "balancer" else invw.GPU_GROUP)


# ---------------------------------------------------------------------------------------------------------------
# allocation


def _index_for(name: str) -> int:
    if name == DEFAULT_NAME:
        return 0
    used = {0}
    for other in rack_names():
        st = RackState.load(other)
        if st is not None:
            used.add(st.index)
        idx_file = rack_dir(other) / "index"
        if idx_file.is_file() and idx_file.read_text().strip().isdigit():
            used.add(int(idx_file.read_text()))
    existing = set(network.bridges())
    for i in range(1, network.MAX_RACKS):
        if i not in used and network.bridge_name(i) not in existing:
            return i
    raise UsageError("no free rack subnet left in 198.18.0.0/15: bring other racks down")


def _new_state(opts: UpOptions, index: int) -> RackState:
    gw = network.gateway(index)
    st = RackState(
        name=opts.name,
        index=index,
        bridge=network.bridge_name(index),
        gateway=gw,
        prefix=24,
        nodes=opts.nodes,
        with_vllm=opts.with_vllm,
        balancers=opts.balancers,
        clusters=opts.want_clusters,
        spec_file=str(opts.spec_file.resolve()) if opts.spec_file else None,
        repo_url=f"http://{gw}:{serve.PORT}/nvidia/",
        repo_tls_url=f"https://{gw}:{serve.TLS_PORT}/nvidia/",
        inventory=str(invw.inventory_dir(opts.name) / "hosts.ini"),
    )
    st.hosts = [
        HostState(name=name, machine=network.machine_name(index, i), address=network.host_address(index, i),
                  index=i, role="node" if i <= opts.nodes else "balancer")
        for i, name in enumerate(host_names(opts.nodes, opts.balancers), start=1)
    ]
    return st


def host_names(nodes: int, balancers: int = 0) -> list[str]:
    """node01.., then the balancer hosts lb01.. (numbered on after the nodes)."""
    return [f"node{i:02d}" for i in range(1, nodes + 1)] + [f"lb{j:02d}" for j in range(1, balancers + 1)]


# ---------------------------------------------------------------------------------------------------------------
# up


def up(opts: UpOptions, log: Log = _nolog) -> UpResult:
    require_root()
    check_name(opts.name)
    if not 1 <= opts.nodes <= MAX_NODES:
        raise UsageError(f"--nodes {opts.nodes}: a rack has 1..{MAX_NODES} nodes")
    if not 0 <= opts.balancers <= MAX_BALANCERS:
        raise UsageError(f"--balancers {opts.balancers}: a rack has 0..{MAX_BALANCERS} balancer hosts")
    t0 = time.monotonic()
    from provisioner_testbed import vault

    vault.password_file()  # the racks' vault password exists before anything reads the inventory
    with rootfs.locked(racks_dir() / f".{opts.name}.lock"):
        st = RackState.load(opts.name)
        if st is not None and st.complete:
            _check_same(st, opts)
            repaired = _repair(st, log)
            _write_inventory(st)
            return UpResult(st, created=False, repaired=tuple(repaired), seconds=time.monotonic() - t0)
        if st is not None or rack_dir(opts.name).exists():
            log(f"rack '{opts.name}' was left half-built (crash?): cleaning it up first")
            _teardown(opts.name, log)
        specs = host_input_specs(opts.spec_file, host_names(opts.nodes, opts.balancers), with_vllm=opts.with_vllm)
        st = _create(opts, specs, log)
        return UpResult(st, created=True, repaired=(), seconds=time.monotonic() - t0)


def _check_same(st: RackState, opts: UpOptions) -> None:
    want_spec = str(opts.spec_file.resolve()) if opts.spec_file else None
    diffs = []
    if st.nodes != opts.nodes:
        diffs.append(f"{st.nodes} nodes (asked {opts.nodes})")
    if st.balancers != opts.balancers:
        diffs.append(f"{st.balancers} balancer host(s) (asked {opts.balancers})")
    if st.with_vllm != opts.with_vllm:
        diffs.append("with vLLM" if st.with_vllm else "without vLLM")
    if st.clusters != opts.want_clusters:
        diffs.append("with vLLM clusters in its inventory" if st.clusters else "without vLLM clusters")
    if opts.spec_file is not None and st.spec_file != want_spec:
        diffs.append(f"spec {st.spec_file or '(defaults)'}")
    if diffs:
        flag = "" if st.name == DEFAULT_NAME else f" --name {st.name}"
        raise UsageError(f"rack '{st.name}' is already up with {', '.join(diffs)}: run `provision testbed down{flag}` "
                         "first to change it")


def _create(opts: UpOptions, specs: dict[str, dict[str, Any]], log: Log) -> RackState:
    """Build a new rack; on any failure (or Ctrl-C) remove what was made, so a failed `up` leaves nothing."""
    try:
        return _create_inner(opts, specs, log)
    except BaseException:
        if rack_dir(opts.name).exists() and os.environ.get("PROVISIONER_TESTBED_KEEP_FAILED") != "1":
            try:
                _teardown(opts.name, _nolog)
            except Exception as exc:  # report the first error, not the cleanup's
                log(f"cleanup after the failed up also failed: {exc}")
        raise


def _create_inner(opts: UpOptions, specs: dict[str, dict[str, Any]], log: Log) -> RackState:
    cache = rootfs.cache_dir()
    t = time.monotonic()

    def phase(key: str) -> None:
        nonlocal t
        now = time.monotonic()
        st.timings[key] = round(now - t, 2)
        t = now

    with rootfs.locked(racks_dir() / ".alloc.lock"):
        index = _index_for(opts.name)
        st = _new_state(opts, index)
        st.dir.mkdir(parents=True, exist_ok=True)
        (st.dir / "index").write_text(str(index))
        st.save()  # from here on, `down` knows what to clean even if we crash
    base = rootfs.ensure_base(cache, log=log)
    lowers = [str(base)]
    if opts.with_vllm:
        from provisioner_testbed import vllm_image

        lowers.insert(0, str(vllm_image.ensure_layer(cache, base, log=log)))
    st.lowers = lowers
    repo_dir = _ensure_repo(cache, log)
    phase("images")
    st.save()

    for change in network.ensure_host_limits():
        log(f"raised {change} (many hosts on one kernel)")
    network.ensure_bridge(index)
    st.proxy = proxy.start(st.gateway, f"{network.subnet(index)}", st.dir / "proxy").to_json()
    mapping = {"/nvidia/": repo_dir} if repo_dir else {}
    st.serve = serve.start(f"{st.gateway}:{serve.PORT}", mapping, st.dir / "serve.log", tag=st.dir,
                           tls=_repo_tls(st)).to_json()
    st.save()

    key = _keypair(st)
    proxy_url = f"http://{st.gateway}:{proxy.PORT}"

    def prepare(h: HostState) -> None:
        hp = hostmod.paths(st, h)
        hostmod.mount_root(hp, st.lowers)
        hostmod.write_identity(st, h, key, proxy_url=proxy_url)
        h.host_key = Path(f"{st.dir}/ssh/hostkeys/{h.name}_ed25519.pub").read_text().strip()
        materialize(hp, specs[h.name])

    phase("network")
    with ThreadPoolExecutor(max_workers=min(8, len(st.hosts))) as ex:
        list(ex.map(prepare, st.hosts))
    _write_known_hosts(st)
    phase("prepare")
    for h in st.hosts:
        h.nspawn = hostmod.boot(st, h).to_json()
    st.save()
    log(f"booting {len(st.hosts)} host(s) on {st.bridge} ({network.subnet(index)})")
    _wait_ready(st, [h.name for h in st.hosts])
    phase("boot")
    _write_inventory(st)
    st.complete = True
    st.save()
    log("phases (s): " + ", ".join(f"{k} {v}" for k, v in st.timings.items()))
    return st


def _repo_key_fingerprint(served: Path | None) -> str:
    """The fingerprint of the served stand-in key (`gpg --show-keys`), "" without a repo: the rack's inventory pins
    it as nvidia_repo_key_fingerprints."""
    key = served / "testbed-archive-keyring.gpg" if served else None
    if key is None or not key.is_file():
        return ""
    with tempfile.TemporaryDirectory(prefix="pv-gpg-") as home:
        out = subprocess.run(["gpg", "--homedir", home, "--batch", "--with-colons", "--show-keys", str(key)],
                             capture_output=True, text=True, check=True).stdout
    return next((ln.split(":")[9] for ln in out.splitlines() if ln.startswith("fpr:")), "")


def _ensure_repo(cache: Path, log: Log) -> Path | None:
    try:
        from provisioner_testbed import repo  # type: ignore[attr-defined]
    except ImportError:
        log("warning: the stand-in NVIDIA repo (provisioner_testbed.repo) is not available: /nvidia/ serves nothing")
        return None
    return repo.ensure_repo(cache)


def _keypair(st: RackState) -> str:
    d = st.dir / "ssh"
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    key = d / "id_ed25519"
    if not key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"provisioner-testbed-{st.name}",
                        "-f", str(key)], check=True, capture_output=True)
    return Path(f"{key}.pub").read_text()


def _write_known_hosts(st: RackState) -> None:
    lines = [f"{h.address},{h.name} {h.host_key.split()[0]} {h.host_key.split()[1]}\n" for h in st.hosts if h.host_key]
    p = st.dir / "ssh" / "known_hosts"
    tmp = p.with_suffix(".tmp")
    tmp.write_text("".join(lines))
    os.replace(tmp, p)


def boot_failure(st: RackState, h: HostState) -> str:
    """The telling line of a host's boot log (ANSI colours stripped)."""
    import re

    try:
        lines = hostmod.paths(st, h).log.read_text(errors="replace").splitlines()[-40:]
    except OSError:
        return "no boot log"
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", ln).strip() for ln in lines if ln.strip()]
    bad = [ln for ln in lines if re.search(r"fail|error|cannot|too many", ln, re.I)]
    return (bad or lines or ["empty boot log"])[0]


def _wait_ready(st: RackState, names: list[str]) -> None:
    """sshd answers on every host, and a real login with host key checking ON works. Fails at once when a host's
    nspawn exited (with the telling line of its boot log)."""
    hs = [h for h in st.hosts if h.name in names]
    timeout = SSH_TIMEOUT_BASE + SSH_TIMEOUT_PER_HOST * len(hs)
    deadline = time.monotonic() + timeout
    left = list(hs)
    with ThreadPoolExecutor(max_workers=min(16, len(hs))) as pool:
        while left:
            answered = list(pool.map(lambda h: hostmod.ssh_banner(h.address, 0.5), left))
            left = [h for h, ok in zip(left, answered, strict=True) if not ok]
            dead = [h for h in left if h.proc is None or not h.proc.alive()]
            if dead:
                h = dead[0]
                raise RuntimeError(f"{h.name} did not boot: {boot_failure(st, h)} (log {hostmod.paths(st, h).log})")
            if left and time.monotonic() > deadline:
                raise RuntimeError(f"sshd did not answer within {timeout:.0f} s on: {', '.join(h.name for h in left)} "
                                   f"(log {hostmod.paths(st, left[0]).log})")
            if left:
                time.sleep(0.2)

    def login(h: HostState) -> tuple[str, int, str]:
        for _ in range(20):
            p = subprocess.run(hostmod.ssh_argv(st, h.address, "true"), capture_output=True, text=True)
            if p.returncode == 0:
                break
            time.sleep(0.5)
        return h.name, p.returncode, p.stderr.strip()

    with ThreadPoolExecutor(max_workers=min(8, len(hs))) as ex:
        failed = [(n, e) for n, rc, e in ex.map(login, hs) if rc != 0]
    if failed:
        raise RuntimeError(f"SSH login failed on {failed[0][0]}: {failed[0][1]}")


#: The alert receiver of a vLLM rack: `provision receiver serve INVENTORY --listen GATEWAY:PORT` on the controller;
#: the token is vaulted in the inventory (group all) like a site's.
ALERT_RECEIVER_PORT = 9095
ALERT_RECEIVER_TOKEN = "testbed-alert-receiver-token"


def alert_loop_vars(gateway: str) -> dict[str, Any]:
    """group_vars/monitoring.yml of a vLLM rack: Prometheus and Alertmanager on the one host, the acting alerts to the
    controller's receiver (also scraped: the site's incidents and breaker), no DCGM exporter (simulated GPUs)."""
    return {"monitoring_alertmanagers": ["127.0.0.1:9093"], "monitoring_dcgm_exporter": False,
            "alertmanager_receiver_url": f"http://{gateway}:{ALERT_RECEIVER_PORT}/alerts",
            "monitoring_receiver_targets": [f"{gateway}:{ALERT_RECEIVER_PORT}"]}


def _write_inventory(st: RackState) -> None:
    specs = {h.name: _load_spec(st, h) for h in st.hosts}
    extra: dict[str, Any] = {}
    cluster_vars: dict[str, dict[str, Any]] = {}
    from provisioner_testbed import bmc

    inv_hosts = tuple(dataclasses.replace(_inv_host(h, specs[h.name]),
                                          bmc=tuple(bmc.inventory_vars(st.name, h.name).items()))
                      for h in st.hosts)
    nodes = [h for h in inv_hosts if h.group == invw.GPU_GROUP]  # the balancer hosts' specs are not hardware
    if st.with_vllm and st.clusters:  # the vLLM area owns these values (docs/development.md, "vLLM on the testbed")
        from provisioner_testbed import vllm_image

        extra, cluster_vars = vllm_image.testbed_rack_inventory(
            invw.clusters([h.name for h in nodes]), {h.name: h.gpu_count for h in nodes},
            f"{st.gateway}/{st.prefix}")
    if any(h.efa_devices for h in nodes):  # the stand-in EFA installer, from the rack's repo server
        from provisioner_testbed import repo

        version = repo.efa_installer()[0]
        name = repo.efa_tarball_name(version)
        served = _ensure_repo(rootfs.cache_dir(), _nolog)  # this checkout's build (built already: cheap)
        sha = (served / repo.EFA_DIR / (name + ".sha256")).read_text().split()[0] if served else ""
        extra = {"efa_installer_url": f"{st.repo_url}{repo.EFA_DIR}/{name}", "efa_installer_version": version,
                 "efa_installer_sha256": sha, **extra}
    from provisioner_testbed import vllm_image

    # every rack's inventory holds a vaulted secret (the clusters' API key; a plain rack's has no cluster to use it),
    # so every rack test goes through the vault path: loading, the drift's input digest, ansible-playbook's secrets
    extra = {"vllm_api_key": vllm_image.TESTBED_API_KEY, **extra}
    monitoring: dict[str, Any] = {}
    if st.with_vllm and st.clusters and any(h.group == invw.LB_GROUP for h in inv_hosts):
        # the alert loop from the start (docs/monitoring.md, "The alert loop"): Prometheus + Alertmanager on the
        # first balancer host, routed to the receiver on the controller (the rack bridge's address)
        monitoring = alert_loop_vars(st.gateway)
        extra = {**extra, "alert_receiver_token": ALERT_RECEIVER_TOKEN}
    inv = invw.InvRack(
        name=st.name,
        hosts=inv_hosts,
        key_file=str(st.dir / "ssh" / "id_ed25519"),
        known_hosts=str(st.dir / "ssh" / "known_hosts"),
        repo_url=st.repo_tls_url or st.repo_url,
        repo_ca_pem=(tls_dir[1] / "ca.pem").read_text() if (tls_dir := _repo_tls(st)) else "",
        proxy_url=f"http://{st.gateway}:{proxy.PORT}",
        repo_key_fingerprint=_repo_key_fingerprint(_ensure_repo(rootfs.cache_dir(), _nolog)),
        extra_vars={**extra, **bmc.group_vars(st.name)},
        cluster_vars=cluster_vars,
        clusters=st.clusters,
        monitoring_vars=monitoring,
    )
    from provisioner_testbed import vault

    # the secrets vaulted, as docs/inventory.md asks of a site (ANSIBLE_VAULT_PASSWORD_FILE names the password file)
    st.inventory = str(invw.write(inv, vault_password_file=vault.password_file()))


def _load_spec(st: RackState, h: HostState) -> dict[str, Any]:
    try:
        return json.loads(hostmod.paths(st, h).spec.read_text())
    except (OSError, ValueError):
        return {"node": h.name}


def _repo_tls(st: RackState) -> tuple[str, Path] | None:
    """(HTTPS address, certificate dir) of the rack's repo server: its own CA signs the bridge address, as a site's
    internal CA signs its mirror; None for a rack made before (its inventory keeps the plain-HTTP URL)."""
    if not st.repo_tls_url:
        return None
    from provisioner_testbed import tls

    d = st.dir / "repo-tls"
    tls.ensure(d, st.gateway, f"provisioner testbed repo CA ({st.name})")
    return f"{st.gateway}:{serve.TLS_PORT}", d


def issue_certificate(name: str, address: str) -> tuple[str, str]:
    """A server certificate for `address` (a rack host serving as a site's mirror) issued by the rack's repo CA, the
    one the rack's inventory gives the nodes in site_ca_certificates: (certificate PEM, key PEM). Kept in the rack
    directory (gone with the rack), made once."""
    st = load(name)
    d = _repo_tls(st)
    if d is None:
        raise UsageError(f"rack '{name}' was made before its repo had TLS: take it down and bring it up again")
    from provisioner_testbed import tls

    return tls.issue(d[1], address, st.dir / "issued-tls" / address)


def _repair(st: RackState, log: Log) -> list[str]:
    """Restart what died (proxy, repo server, stopped hosts); return the names of what was restarted."""
    fixed: list[str] = []
    network.ensure_host_limits()
    network.ensure_bridge(st.index)
    if not (p := Proc.from_json(st.proxy)) or not p.alive():
        st.proxy = proxy.start(st.gateway, str(network.subnet(st.index)), st.dir / "proxy").to_json()
        fixed.append("proxy")
    if not (p := Proc.from_json(st.serve)) or not p.alive():
        repo_dir = _ensure_repo(rootfs.cache_dir(), log)
        st.serve = serve.start(f"{st.gateway}:{serve.PORT}", {"/nvidia/": repo_dir} if repo_dir else {},
                               st.dir / "serve.log", tag=st.dir, tls=_repo_tls(st)).to_json()
        fixed.append("repo server")
    down = [h for h in st.hosts if h.proc is None or not h.proc.alive()]
    for h in down:
        start_host(st, h)
    if down:
        st.save()
        _wait_ready(st, [h.name for h in down])
        fixed += [h.name for h in down]
    st.save()
    if fixed:
        log(f"restarted: {', '.join(fixed)}")
    return fixed


def host_lowers(st: RackState, h: HostState) -> list[str]:
    """The host's overlay lower dirs, top first: its own (reset_host(bare=True)) or the rack's."""
    return h.lowers if h.lowers is not None else st.lowers


def start_host(st: RackState, h: HostState) -> None:
    hp = hostmod.paths(st, h)
    hostmod.mount_root(hp, host_lowers(st, h))
    h.nspawn = hostmod.boot(st, h).to_json()


# ---------------------------------------------------------------------------------------------------------------
# down


def down(name: str, log: Log = _nolog) -> bool:
    """Remove the rack completely; False when there was nothing to remove."""
    require_root()
    check_name(name)
    if not rack_dir(name).exists():
        return False
    with rootfs.locked(racks_dir() / f".{name}.lock"):
        _teardown(name, log)
    return True


def down_all(log: Log = _nolog) -> list[str]:
    """Every rack this machine's state dir knows, plus stray `pvbrN` bridges (CI's clean start)."""
    require_root()
    names = rack_names()
    for n in names:
        down(n, log)
    for br in network.bridges():
        network.delete_link(br)
    return names


def _container_pids(under: Path) -> list[int]:
    """Container inits (pid 1 of their own pid namespace) whose root file system lives inside `under`: what an
    nspawn that was SIGKILLed in a crash leaves behind. Their /proc/PID/root reads "/" from here (another mount
    namespace), so look at their mount table: the overlay's upperdir names the rack directory."""
    out = []
    needle = str(under).rstrip("/") + "/"
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            nspid = next((ln.split()[1:] for ln in (d / "status").read_text().splitlines()
                          if ln.startswith("NSpid:")), [])
            if len(nspid) < 2 or nspid[-1] != "1":
                continue
            if needle in (d / "mountinfo").read_text():
                out.append(int(d.name))
        except OSError:
            continue
    return out


def _teardown(name: str, log: Log) -> None:
    d = rack_dir(name)
    st = RackState.load(name)
    index = st.index if st else _read_index(d)
    if st:
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(st.hosts)))) as ex:
            list(ex.map(hostmod.kill, st.hosts))
    # Anything else we started for this rack carries its directory in its command line (nspawn, tinyproxy, the
    # repo server) or runs inside one of its roots (an orphaned container).
    for _ in range(3):
        stray = [p for p in (Proc.of(x) for x in pids_with_arg_under(str(d) + "/")) if p]
        stray += [p for p in (Proc.of(x) for x in _container_pids(d)) if p]
        if not stray:
            break
        terminate(stray, 5.0)
    left = hostmod.umount_all(d)
    if index is not None:
        for v in network.veths_of(index):
            network.delete_link(v)
        network.delete_link(network.bridge_name(index))
    inv = invw.inventory_dir(name)
    if inv.is_dir():
        import shutil

        shutil.rmtree(inv, ignore_errors=True)
    if left:
        raise RuntimeError(f"could not unmount: {', '.join(left)}")
    import shutil

    # Per-host trees in parallel: unlink is slow-ish on this disk (discard), so overlap it.
    hostdirs = list((d / "hosts").iterdir()) if (d / "hosts").is_dir() else []
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(hostdirs)))) as ex:
        list(ex.map(lambda p: shutil.rmtree(p, ignore_errors=True), hostdirs))
    shutil.rmtree(d, ignore_errors=True)
    log(f"rack '{name}' removed")


def _read_index(d: Path) -> int | None:
    try:
        t = (d / "index").read_text().strip()
        return int(t) if t.isdigit() else None
    except OSError:
        return None


# ---------------------------------------------------------------------------------------------------------------
# reset, stop/start one host, faults


def load(name: str) -> RackState:
    check_name(name)
    st = RackState.load(name)
    if st is None or not st.complete:
        flag = "" if name == DEFAULT_NAME else f" --name {name}"
        raise UsageError(f"rack '{name}' is not up: run `provision testbed up{flag}`")
    return st


def get_host(st: RackState, host: str) -> HostState:
    h = st.host(host)
    if h is None:
        raise UsageError(f"no host {host!r} in rack '{st.name}' (hosts: {', '.join(x.name for x in st.hosts)})")
    return h


def reset(name: str, log: Log = _nolog) -> RackState:
    """Every host back to a fresh disk (same identity, address and host key), hardware back to the rack spec."""
    require_root()
    with rootfs.locked(racks_dir() / f".{name}.lock"):
        st = load(name)
        with ThreadPoolExecutor(max_workers=min(16, len(st.hosts))) as ex:
            list(ex.map(hostmod.stop, st.hosts))
        specs = host_input_specs(Path(st.spec_file) if st.spec_file else None, [h.name for h in st.hosts],
                                 with_vllm=st.with_vllm)
        key = Path(f"{st.dir}/ssh/id_ed25519.pub").read_text()
        proxy_url = f"http://{st.gateway}:{proxy.PORT}"
        for h in st.hosts:
            h.lowers = None
            _fresh_disk(st, h, key, proxy_url, specs[h.name])
        st.save()
        _wait_ready(st, [h.name for h in st.hosts])
        _write_inventory(st)
        st.save()
        log(f"rack '{name}' reset: {len(st.hosts)} host(s) on fresh disks")
        return st


def _fresh_disk(st: RackState, h: HostState, key: str, proxy_url: str, spec: dict[str, Any]) -> None:
    """Boot a stopped host on an empty upper dir over its lowers, identity and hardware written again."""
    import shutil

    hp = hostmod.paths(st, h)
    hostmod.umount_all(hp.root)
    shutil.rmtree(hp.upper, ignore_errors=True)
    shutil.rmtree(hp.work, ignore_errors=True)
    hostmod.mount_root(hp, host_lowers(st, h))
    hostmod.write_identity(st, h, key, proxy_url=proxy_url)
    materialize(hp, spec)
    h.nspawn = hostmod.boot(st, h).to_json()


def reset_host(name: str, host: str, *, bare: bool = False, log: Log = _nolog) -> HostState:
    """One host back to a fresh disk (same identity, address and host key; hardware back to the rack spec), the
    others untouched. bare: the base root alone, no vLLM golden layer (a host as a site receives it); otherwise the
    rack's layers. The inventory is not rewritten."""
    require_root()
    with rootfs.locked(racks_dir() / f".{name}.lock"):
        st = load(name)
        h = get_host(st, host)
        hostmod.stop(h)
        specs = host_input_specs(Path(st.spec_file) if st.spec_file else None, [x.name for x in st.hosts],
                                 with_vllm=st.with_vllm)
        h.lowers = st.lowers[-1:] if bare else None  # the base root is the last lower
        _fresh_disk(st, h, Path(f"{st.dir}/ssh/id_ed25519.pub").read_text(), f"http://{st.gateway}:{proxy.PORT}",
                    specs[h.name])
        st.save()
        _wait_ready(st, [h.name])
        st.save()
        log(f"rack '{name}': {host} on a fresh disk{' (base root only)' if bare else ''}")
        return h


def stop_host(name: str, host: str) -> None:
    require_root()
    with rootfs.locked(racks_dir() / f".{name}.lock"):
        st = load(name)
        h = get_host(st, host)
        hostmod.stop(h)
        hostmod.umount_all(hostmod.paths(st, h).merged)


def start_host_cmd(name: str, host: str) -> bool:
    """Start a stopped host; False when it was already running."""
    require_root()
    with rootfs.locked(racks_dir() / f".{name}.lock"):
        st = load(name)
        h = get_host(st, host)
        if h.proc is not None and h.proc.alive():
            return False
        start_host(st, h)
        st.save()
        _wait_ready(st, [h.name])
        return True


def bmcs(name: str, hosts: list[str] | None = None, *, stop: bool = False,
         firmware: dict[str, str] | None = None) -> dict[str, str]:
    """Start the rack's BMCs (every host's, or `hosts`'), or stop those hosts' BMCs (`stop`: the BMC unreachable
    fault), or set what their firmware inventory reports (`firmware`: component -> version); the inventory gets
    bmc_address/bmc_port per host and the credentials' variables. {host: BMC status}."""
    from provisioner_testbed import bmc

    require_root()
    st = load(name)
    names = hosts or [h.name for h in st.hosts]
    for n in names:
        get_host(st, n)
    if stop:
        bmc.stop(name, names)
    elif firmware:
        for n in names:
            for comp, version in firmware.items():
                bmc.set_firmware(name, n, comp, version)
    else:
        bmc.start(st, names)
        with rootfs.locked(racks_dir() / f".{name}.lock"):
            _write_inventory(load(name))
    return {n: bmc.status(name, n) for n in names}


def parse_fault(arg: str) -> dict[str, Any]:
    """`NAME[=VALUE]` on the command line -> a `faults:` entry of the hardware spec (pure).

    hca_down=mlx5_3[,mlx5_4]  hca_rate=mlx5_2:200  xid=79 | xid=GPU:79  ecc_uncorrectable=GPU[:COUNT]
    missing_gpu[=N]  nvlink_down[=GPU]  row_remap_pending[=GPU]  fm_mismatch[=VERSION]  persistence_off
    efa_missing[=N|=rdmap79s0,...]  nvlsm_fail  imex_degraded  acs_on[=GPU|=BRIDGE,...]
    vbios=VERSION | vbios=GPU:VERSION  hca_fw=VERSION | hca_fw=HCA:VERSION
    burn-in: gemm_slow=GPU|all[:FRACTION]  hbm_low=GPU[:FRACTION]  pcie_downtrained=GPU[:x8|:gen4]
    thermal_slowdown=GPU  sdc_mismatch=GPU  nccl_low[=FRACTION]
    """
    name, eq, value = arg.partition("=")
    name = name.strip().replace("-", "_")

    def ints(v: str, what: str) -> list[int]:
        try:
            return [int(x) for x in v.split(",") if x != ""]
        except ValueError:
            raise UsageError(f"fault {arg!r}: {what} must be integers, got {v!r}") from None

    if name == "hca_down":
        if not value:
            raise UsageError(f"fault {arg!r}: name the HCA, e.g. hca_down=mlx5_3")
        return {"hca_down": value.split(",")}
    if name == "hca_rate":
        hca, _, rate = value.partition(":")
        if not hca or not rate.isdigit():
            raise UsageError(f"fault {arg!r}: expected hca_rate=HCA:GBPS, e.g. hca_rate=mlx5_2:200")
        return {"hca_rate": {hca: int(rate)}}
    if name == "xid":
        gpu, _, code = value.rpartition(":")
        c = ints(code, "the XID code")
        if len(c) != 1:
            raise UsageError(f"fault {arg!r}: expected xid=CODE or xid=GPU:CODE, e.g. xid=79")
        return {"xid": [{"gpu": ints(gpu, "the GPU index")[0] if gpu else 0, "code": c[0]}]}
    if name == "ecc_uncorrectable":
        gpu, _, count = (value or "0").partition(":")
        return {"ecc_uncorrectable": [{"gpu": ints(gpu, "the GPU index")[0],
                                       "count": ints(count, "the count")[0] if count else 1}]}
    if name == "missing_gpu":
        return {"missing_gpu": ints(value, "the count")[0] if value else 1}
    if name in ("nvlink_down", "row_remap_pending"):
        return {name: ints(value, "GPU indexes") if value else True}
    if name == "fm_mismatch":
        return {"fm_mismatch": value if value else True}
    if name == "persistence_off":
        return {"persistence_off": True}
    if name == "efa_missing":
        if value and not value.isdigit():
            return {"efa_missing": value.split(",")}
        return {"efa_missing": ints(value, "the count")[0] if value else 1}
    if name in ("nvlsm_fail", "imex_degraded"):
        return {name: True}
    if name in ("vbios", "hca_fw"):
        key, sep, version = value.rpartition(":")
        if not version:
            raise UsageError(f"fault {arg!r}: expected {name}=VERSION or {name}="
                             f"{'GPU' if name == 'vbios' else 'HCA'}:VERSION, e.g. {name}=96.00.61.00.01")
        if not sep:
            return {name: version}
        if name == "vbios":
            return {name: {str(ints(key, "the GPU index")[0]): version}}
        return {name: {key: version}}
    if name in ("gemm_slow", "hbm_low"):  # burn-in degraded modes: GPU|all[:FRACTION]
        gpu, _, frac = (value or "all").partition(":")
        try:
            item: dict[str, Any] = {"gpu": "all" if gpu == "all" else ints(gpu, "the GPU index")[0]}
            if frac:
                item["fraction"] = float(frac)
        except (ValueError, IndexError):
            raise UsageError(f"fault {arg!r}: expected {name}=GPU[:FRACTION] or {name}=all:FRACTION, "
                             f"e.g. {name}=3:0.9") from None
        return {name: [item]}
    if name == "pcie_downtrained":  # GPU:xWIDTH or GPU:genN
        gpu, _, how = (value or "0").partition(":")
        item = {"gpu": ints(gpu, "the GPU index")[0] if gpu else 0}
        if how.startswith("x") and how[1:].isdigit():
            item["width"] = int(how[1:])
        elif how.startswith("gen") and how[3:].isdigit():
            item["gen"] = int(how[3:])
        elif how:
            raise UsageError(f"fault {arg!r}: expected pcie_downtrained=GPU[:xWIDTH|:genN], e.g. pcie_downtrained=1:x8")
        else:
            item["width"] = 8
        return {"pcie_downtrained": [item]}
    if name in ("thermal_slowdown", "sdc_mismatch"):
        return {name: ints(value, "GPU indexes") if value else True}
    if name == "nccl_low":
        try:
            return {"nccl_low": float(value) if value else 0.8}
        except ValueError:
            raise UsageError(f"fault {arg!r}: expected nccl_low[=FRACTION], e.g. nccl_low=0.8") from None
    if name == "acs_on":  # every ACS bridge, or GPU indexes / bridge addresses (the switch port above a GPU)
        if not value:
            return {"acs_on": True}
        return {"acs_on": [int(x) if x.isdigit() else x for x in value.split(",") if x]}
    from provisioner_testbed import hwspec

    raise UsageError(f"unknown fault {name!r} (known: {', '.join(hwspec.FAULTS)})")


def merge_faults(current: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Add `new` faults to `current` (lists extend, mappings update, scalars replace) (pure)."""
    out = copy.deepcopy(current)
    for k, v in new.items():
        old = out.get(k)
        if isinstance(old, list) and isinstance(v, list):
            out[k] = old + [x for x in v if x not in old]
        elif isinstance(old, dict) and isinstance(v, dict):
            out[k] = {**old, **v}
        else:
            out[k] = v
    return out


def fault(name: str, host: str, faults: list[str], log: Log = _nolog) -> dict[str, Any]:
    """Inject faults into a running (or stopped) host's hardware, live; return its new resolved spec."""
    require_root()
    parsed: dict[str, Any] = {}
    for f in faults:
        parsed = merge_faults(parsed, parse_fault(f))
    with rootfs.locked(racks_dir() / f".{name}.lock"):
        st = load(name)
        h = get_host(st, host)
        spec = _load_spec(st, h)
        spec["faults"] = merge_faults(dict(spec.get("faults") or {}), parsed)
        resolved = materialize(hostmod.paths(st, h), spec)
        _refresh_sysfs(st, h)
        return resolved


def clear(name: str, host: str) -> dict[str, Any]:
    """Back to the rack spec's hardware for that host (faults from `fault` removed)."""
    require_root()
    with rootfs.locked(racks_dir() / f".{name}.lock"):
        st = load(name)
        h = get_host(st, host)
        spec = host_input_specs(Path(st.spec_file) if st.spec_file else None, [x.name for x in st.hosts],
                                with_vllm=st.with_vllm)[h.name]
        resolved = materialize(hostmod.paths(st, h), spec)
        _refresh_sysfs(st, h)
        return resolved


def _refresh_sysfs(st: RackState, h: HostState) -> None:
    """Re-lay the sysfs overlay inside the host (HCA directories may have appeared or gone)."""
    if h.proc is None or not h.proc.alive():
        return
    subprocess.run(hostmod.ssh_argv(st, h.address, "systemctl", "restart", "hwsim-sysfs.service"),
                   capture_output=True, timeout=30)


# ---------------------------------------------------------------------------------------------------------------
# status


@dataclass(frozen=True)
class HostStatus:
    name: str
    address: str
    running: bool
    ssh: bool
    pid: int | None
    memory_mib: float | None  # PSS of every process of the host (+ its nspawn)
    faults: dict[str, Any]
    gpus: str
    hcas: int


def pss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def host_memory_mib(st: RackState, h: HostState) -> float | None:
    """PSS of the host's nspawn and every process inside the container (MiB)."""
    p = h.proc
    if p is None or not p.alive():
        return None
    return sum(pss_kib(x) for x in descendants(p.pid)) / 1024


def descendants(pid: int) -> list[int]:
    """pid and every process below it (a host's nspawn: its whole container)."""
    out, todo = [], [pid]
    while todo:
        x = todo.pop()
        out.append(x)
        todo += children(x)
    return out


@dataclass(frozen=True)
class RackSummary:
    name: str
    nodes: int
    running: int
    bridge: str
    subnet: str
    complete: bool
    with_vllm: bool
    inventory: str


def list_racks() -> list[RackSummary]:
    """Every rack in the state dir (also half-built ones: `down --name` removes those)."""
    require_root()
    out = []
    for n in rack_names():
        st = RackState.load(n)
        if st is None:
            out.append(RackSummary(n, 0, 0, "?", "?", False, False, ""))
            continue
        running = sum(1 for h in st.hosts if h.proc is not None and h.proc.alive())
        out.append(RackSummary(n, st.nodes, running, st.bridge, str(network.subnet(st.index)), st.complete,
                               st.with_vllm, st.inventory))
    return out


def status(name: str) -> list[HostStatus]:
    require_root()
    st = load(name)
    from provisioner_testbed import hwspec

    out = []
    for h in st.hosts:
        spec = _load_spec(st, h)
        try:
            r = hwspec.resolve(spec)
            gpus = f"{len(r['gpus'])}x {r['gpu_model']}"
            hcas = sum(1 for x in r["hcas"] for port in x["ports"] if port["state"] == "ACTIVE")
        except UsageError:
            gpus, hcas = "?", 0
        running = h.proc is not None and h.proc.alive()
        out.append(HostStatus(
            name=h.name, address=h.address, running=running,
            ssh=running and hostmod.ssh_banner(h.address, 1.0),
            pid=h.proc.pid if running and h.proc else None,
            memory_mib=host_memory_mib(st, h), faults=dict(spec.get("faults") or {}), gpus=gpus, hcas=hcas,
        ))
    return out


# ---------------------------------------------------------------------------------------------------------------
# a handle for tests and other tools


@dataclass(frozen=True)
class Handle:
    """What a caller needs to use a running rack (the pytest `testbed` fixture yields this)."""

    name: str
    inventory: Path
    hosts: dict[str, str]  # name -> address, in order
    key: Path
    known_hosts: Path
    gateway: str
    bridge: str
    repo_url: str  # plain HTTP, for test tools
    proxy_url: str
    state_dir: Path
    repo_tls_url: str = ""  # the inventory's nvidia_repo_url (HTTPS, the rack's repo CA), "" on an older rack

    @property
    def names(self) -> list[str]:
        return list(self.hosts)

    def ssh_argv(self, host: str, *command: str) -> list[str]:
        return ["ssh", "-i", str(self.key), "-o", f"UserKnownHostsFile={self.known_hosts}",
                "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
                "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR", f"root@{self.hosts[host]}", *command]

    def ssh(self, host: str, command: str, *, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run a shell command on a host over real SSH (host key checking ON)."""
        return subprocess.run(self.ssh_argv(host, command), capture_output=True, text=True, timeout=timeout)


def handle(st: RackState) -> Handle:
    return Handle(
        name=st.name,
        inventory=Path(st.inventory),
        hosts={h.name: h.address for h in st.hosts},
        key=st.dir / "ssh" / "id_ed25519",
        known_hosts=st.dir / "ssh" / "known_hosts",
        gateway=st.gateway,
        bridge=st.bridge,
        repo_url=st.repo_url,
        proxy_url=f"http://{st.gateway}:{proxy.PORT}",
        state_dir=st.dir,
        repo_tls_url=st.repo_tls_url,
    )


def ensure(name: str = DEFAULT_NAME, nodes: int = DEFAULT_NODES, *, with_vllm: bool = False,
           spec_file: Path | None = None, clusters: bool = True, balancers: int = 0, log: Log = _nolog) -> Handle:
    """Bring the rack up (or reuse it) and return its handle. The rack tests' racks declare the vLLM cluster groups
    unless they ask otherwise (`clusters=False`: the inventory `provision testbed up` writes for a plain rack)."""
    res = up(UpOptions(name=name, nodes=nodes, spec_file=spec_file, with_vllm=with_vllm, clusters=clusters,
                       balancers=balancers), log)
    return handle(res.rack)
