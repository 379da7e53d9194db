"""The inventory a rack hands to the rest of the suite: the real inventory contract (docs/inventory.md), with
connection vars pointing at the rack's key and known_hosts (host key checking ON) and the role variables that point
apt at the testbed's repo and proxy. Pure rendering (`render`) + an atomic, change-only writer (`write`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from provisioner import INVENTORIES
from provisioner_testbed.hosts import HWSIM_MOUNT

DEFAULT_HCAS = [f"mlx5_{i}" for i in range(8)]
NVL72_DOMAIN = "nvl72-a"  # the one NVLink domain of a rack's GB200 trays
GPU_GROUP = "gpu_nodes"
MONITORING_GROUP = "monitoring"  # Prometheus + Alertmanager: the first balancer host of a rack with the alert loop
LB_GROUP = "lb"  # the serving edge's hosts (`testbed up --balancers N`: lb01..): nginx, no GPU stack
MULTI_GROUP = "vllm_pp"  # the 2-node cluster (TP 8 x PP 2)
SINGLE_GROUP = "vllm_single"  # the 1-node cluster (TP 8)
#: What each cluster declares on a plain rack (no vLLM layer): real models from the catalog that fit the
#: simulated H100s, so the generated inventory passes `provision validate` (sizing needs `model_arch`).
PLAIN_MODELS: dict[str, tuple[str, str]] = {
    MULTI_GROUP: ("meta-llama/Llama-3.1-70B-Instruct", "Llama-3.1-70B"),
    SINGLE_GROUP: ("meta-llama/Llama-3.1-8B-Instruct", "Llama-3.1-8B"),
}


@dataclass(frozen=True)
class InvHost:
    name: str
    address: str
    gpu_model: str = "H100-SXM5-80GB"
    gpu_count: int = 8
    ib_hcas: tuple[str, ...] = tuple(DEFAULT_HCAS)
    efa_devices: int = 0  # AWS EFA devices (fabric efa)
    nvlink_domain: str | None = None  # NVL72 trays: the rack's one NVLink domain
    bmc: tuple[tuple[str, Any], ...] = ()  # bmc_address / bmc_port of the host's rack BMC (provisioner_testbed.bmc)
    group: str = GPU_GROUP  # GPU_GROUP, or LB_GROUP for a balancer host (no hardware vars, no BMC)


@dataclass(frozen=True)
class InvRack:
    name: str
    hosts: tuple[InvHost, ...]
    key_file: str
    known_hosts: str
    repo_url: str  # https://GW:8091/nvidia/ (http://GW:8090/nvidia/ on a rack made before the repo had TLS)
    proxy_url: str  # http://GW:3128
    # the stand-in repo's signing key (provisioner_testbed.repo): the roles pin it as nvidia_repo_key_fingerprints
    repo_key_fingerprint: str = ""
    # the CA that signed the repo server's certificate (provisioner_testbed.tls): the nodes trust it through
    # site_ca_certificates (role site_trust), as a site's mirror CA
    repo_ca_pem: str = ""
    extra_vars: dict[str, Any] = field(default_factory=dict)  # merged into group_vars/all.yml
    # group -> settings merged into its vllm_cluster (the vLLM layer's CPU settings; replaces model_arch)
    cluster_vars: dict[str, dict[str, Any]] = field(default_factory=dict)
    # declare the vLLM cluster groups (vllm_pp, vllm_single); a plain rack without them is what `make demo` gets:
    # nothing in site.yml's vLLM area applies, so a plain `provision run` and `provision drift` are clean
    clusters: bool = True
    # the alert loop (docs/monitoring.md): the first balancer host also in group `monitoring` (Prometheus +
    # Alertmanager), these vars in group_vars/monitoring.yml; empty: no monitoring group
    monitoring_vars: dict[str, Any] = field(default_factory=dict)


def inventory_dir(rack: str) -> Path:
    return INVENTORIES / ("testbed" if rack == "rack" else f"testbed-{rack}")


def clusters(names: list[str]) -> dict[str, list[str]]:
    """Cluster groups for the first hosts: a 2-node group, then a 1-node group (as many as the rack allows)."""
    out: dict[str, list[str]] = {}
    if len(names) >= 2:
        out[MULTI_GROUP] = names[:2]
        rest = names[2:]
    else:
        rest = names
    if rest:
        out[SINGLE_GROUP] = rest[:1]
    return out


def _common(hosts: tuple[InvHost, ...], attr: str) -> Any:
    vals = {repr(getattr(h, attr)) for h in hosts}
    return getattr(hosts[0], attr) if len(vals) == 1 else None


#: The variables the writer vaults (`!vault |` values, docs/inventory.md) when it is given a vault password.
SECRET_VARS = ("vllm_api_key", "vllm_hf_token", "bmc_password", "alert_receiver_token")

#: (variable, plain text) -> the vault text (`$ANSIBLE_VAULT;1.1;AES256` + hex lines)
Encrypt = Callable[[str, str], str]


class Vaulted(str):
    """A vault text, written as `!vault |` (a literal block) in the YAML files."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(Vaulted, lambda d, v: d.represent_scalar("!vault", str(v), style="|"))


def render(rack: InvRack, encrypt: Encrypt | None = None) -> dict[str, str]:
    """Relative path -> file content. With `encrypt`, the SECRET_VARS of group_vars/all.yml are vaulted."""
    nodes = tuple(h for h in rack.hosts if h.group == GPU_GROUP)
    balancers = [h for h in rack.hosts if h.group == LB_GROUP]
    groups = clusters([h.name for h in nodes]) if rack.clusters else {}
    rank = {n: i for members in groups.values() for i, n in enumerate(members)}
    common = {a: _common(nodes, a) for a in ("gpu_model", "gpu_count", "ib_hcas", "efa_devices", "nvlink_domain")}

    lines = [
        f"# Generated by `provision testbed up` for rack '{rack.name}': rewritten on every up, do not edit.",
        "# Hardware vars: group_vars/gpu_nodes.yml, and host_vars/ where the rack's spec differs per host.",
        "[gpu_nodes]",
    ]
    for h in nodes:
        hv = [f"ansible_host={h.address}"]
        if h.name in rank:
            hv.append(f"node_rank={rank[h.name]}")
        lines.append(f"{h.name} " + " ".join(hv))
    for g, members in groups.items():
        lines += ["", f"[{g}]", *members]
    if balancers:
        lines += ["", f"[{LB_GROUP}]", *(f"{h.name} ansible_host={h.address}" for h in balancers)]
    if balancers and rack.monitoring_vars:
        lines += ["", f"[{MONITORING_GROUP}]", balancers[0].name]
    files = {"hosts.ini": "\n".join(lines) + "\n"}
    for h in nodes:  # hardware that differs from host to host (from the rack's --spec)
        own = {a: (list(v) if isinstance(v := getattr(h, a), tuple) else v) for a in common if common[a] is None}
        own = _fabric_vars(own, h, common)
        own.update(dict(h.bmc))
        if own:
            files[f"host_vars/{h.name}.yml"] = _yaml(f"Generated: {h.name}'s own hardware (rack spec).", own)

    all_vars: dict[str, Any] = {
        "ansible_user": "root",
        "ansible_ssh_private_key_file": rack.key_file,
        "ansible_ssh_common_args": (
            f"-o UserKnownHostsFile={rack.known_hosts} -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes"
        ),
        "ansible_python_interpreter": "/usr/bin/python3",
        "testbed_rack": rack.name,
        # The roles' site variables, pointed at the testbed the way an air-gapped site points them at its mirror.
        "nvidia_repo_url": rack.repo_url,
        "nvidia_repo_key_url": rack.repo_url + "testbed-archive-keyring.gpg",
        # the stand-in key, pinned as a site pins its mirror's key (NVIDIA's own is the role default)
        **({"nvidia_repo_key_fingerprints": [rack.repo_key_fingerprint]} if rack.repo_key_fingerprint else {}),
        **({"site_ca_certificates": [rack.repo_ca_pem]} if rack.repo_ca_pem else {}),
        "apt_proxy": rack.proxy_url,
        # Containers run the controller's kernel: no headers/DKMS build.
        "nvidia_driver_install_headers": False,
        # A fresh host reboots into the driver it just got (a container reboot takes seconds): the health gate's
        # `reboot` check fails a node that carries /run/reboot-required or runs another module than it has installed.
        "provision_allow_reboot": True,
        # The hardware boundary: the node's sysfs/proc tree and its kernel log are files under the hwsim mount
        # (containers have no /dev/kmsg and no PCI devices). Real nodes keep the roles' defaults (/, /dev/kmsg).
        "nvidia_driver_sysfs_root": HWSIM_MOUNT,
        "node_health_sysfs_root": HWSIM_MOUNT,
        "node_health_kmsg": f"{HWSIM_MOUNT}/kmsg",
        # Burn-in (docs/burn-in.md): the rack has no torch; the GPU measurements come from the hardware stand-in
        # (nvidia-utils' hwsim-burnin, driven by the spec), and its tiers are short so onboarding stays fast.
        "burnin_measure_cmd": "/usr/bin/hwsim-burnin",
        "burnin_load_seconds": 3,
        "burnin_stress_seconds": 3,
        "burnin_soak_rounds": 1,
        # standard's cross-node checks between cluster members: the stand-ins of perftest's ib_write_bw and of
        # nccl-tests' all_reduce_perf (nvidia-utils; figures from each node's spec, the handshake over the rack net)
        "burnin_perftest_cmd": "/usr/bin/hwsim-ib-write-bw",
        "burnin_nccl_cmd": "/usr/bin/hwsim-all-reduce-perf",
        "burnin_ib_seconds": 1,
        # The rack's ledger site (docs/lifecycle.md, Sites): a copy of this inventory elsewhere (the tests make some)
        # is the same site; two racks, both with a node01, are two.
        "provision_site": f"testbed-{rack.name}",
        # The remediation loop acts on the rack (a new site records and recommends: docs/lifecycle.md#rails); the
        # other rails keep their defaults.
        "remediation_rails": {"mode": "act"},
        **rack.extra_vars,
    }
    if encrypt is not None:
        for k in SECRET_VARS:
            if isinstance(all_vars.get(k), str) and all_vars[k]:
                all_vars[k] = Vaulted(encrypt(k, all_vars[k]))
    files["group_vars/all.yml"] = _yaml(
        f"Generated by `provision testbed up` (rack '{rack.name}'): connection and site variables.", all_vars
    )
    gpu_vars: dict[str, Any] = {"fabric": "infiniband", "bootstrap_interface": "host0"}
    for a in ("gpu_model", "gpu_count"):
        if common[a] is not None:
            gpu_vars[a] = common[a]
    if common["ib_hcas"] is not None and not (common["efa_devices"] and not common["ib_hcas"]):
        gpu_vars["ib_hcas"] = list(common["ib_hcas"])
    if common["efa_devices"]:
        gpu_vars.update(fabric="efa", efa_device_count=common["efa_devices"])
    if common["nvlink_domain"]:
        gpu_vars["nvlink_domain"] = common["nvlink_domain"]
    if balancers and rack.monitoring_vars:
        files[f"group_vars/{MONITORING_GROUP}.yml"] = _yaml(
            f"Generated: the alert loop's Prometheus + Alertmanager on {balancers[0].name}.", rack.monitoring_vars)
    files["group_vars/gpu_nodes.yml"] = _yaml("Generated: the simulated nodes' hardware (HGX H100 + NDR).", gpu_vars)
    for g, members in groups.items():
        tp = max(1, min(h.gpu_count for h in rack.hosts if h.name in members))
        model, arch = PLAIN_MODELS[g]
        cluster: dict[str, Any] = {
            "model": model,
            "model_arch": arch,
            "served_model_name": model.split("/")[-1].lower(),
            "tensor_parallel_size": tp,
            "pipeline_parallel_size": len(members),
        }
        if g in rack.cluster_vars:
            cluster.pop("model_arch")  # the layer's settings name a model_config instead
            cluster.update(rack.cluster_vars[g])
        files[f"group_vars/{g}.yml"] = _yaml(f"Generated: vLLM cluster '{g}' ({len(members)} node(s)).",
                                             {"vllm_cluster": cluster})
    return files


def _fabric_vars(own: dict[str, Any], h: InvHost, common: dict[str, Any]) -> dict[str, Any]:
    """A host's own fabric vars where the rack mixes shapes: `fabric: efa` + `efa_device_count` (no ib_hcas) on EFA
    hosts, `nvlink_domain` on NVL72 trays; nothing for values every host shares (group_vars has them)."""
    out = {k: v for k, v in own.items() if k not in ("efa_devices", "nvlink_domain")}
    if common["efa_devices"] is None and h.efa_devices:
        out.update(fabric="efa", efa_device_count=h.efa_devices)
    if common["nvlink_domain"] is None and h.nvlink_domain:
        out["nvlink_domain"] = h.nvlink_domain
    return out


def _yaml(comment: str, data: dict[str, Any]) -> str:
    return f"# {comment}\n---\n" + yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False)


_VAULT_BLOCK = re.compile(r"^(\w+): !vault \|\n((?:[ ]+\S+\n)+)", re.M)


def vault_encrypter(password_file: Path, existing: Mapping[str, str] = {}) -> Encrypt:
    """An `Encrypt` with the password in `password_file`. A variable whose vault text in `existing` (variable ->
    text, from the file written before) still decrypts to the same plain text keeps it: a rewrite of an unchanged
    inventory changes no byte."""
    from ansible.parsing.vault import VaultLib, VaultSecret

    lib = VaultLib([("default", VaultSecret(password_file.read_text().strip().encode()))])

    def encrypt(name: str, plain: str) -> str:
        old = existing.get(name)
        if old:
            try:
                if lib.decrypt(old.encode()).decode() == plain:
                    return old
            except Exception:  # noqa: BLE001 - another password, damaged text: encrypt afresh
                pass
        return lib.encrypt(plain).decode().rstrip("\n") + "\n"

    return encrypt


def vaulted_values(text: str) -> dict[str, str]:
    """variable -> vault text of the `!vault |` values of a YAML file the writer wrote."""
    return {m.group(1): "".join(line.strip() + "\n" for line in m.group(2).splitlines())
            for m in _VAULT_BLOCK.finditer(text)}


def write(rack: InvRack, dest: Path | None = None, vault_password_file: Path | None = None) -> Path:
    """Write the inventory (only files whose content changed, atomically; stale generated files removed). With
    `vault_password_file`, its secrets are vaulted with that password (provisioner_testbed.vault)."""
    dest = dest or inventory_dir(rack.name)
    encrypt = None
    if vault_password_file is not None:
        try:
            before = (dest / "group_vars" / "all.yml").read_text()
        except OSError:
            before = ""
        encrypt = vault_encrypter(vault_password_file, vaulted_values(before))
    files = render(rack, encrypt)
    (dest / "group_vars").mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        p = dest / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.exists() and p.read_text() == text:
            continue
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, p)
    for sub in ("group_vars", "host_vars"):
        for p in (dest / sub).glob("*.yml"):
            if f"{sub}/{p.name}" not in files and p.read_text().startswith("# Generated"):
                p.unlink()
    return dest / "hosts.ini"
