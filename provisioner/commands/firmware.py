"""`provision firmware INVENTORY`: the fleet's firmware as its BMCs report it, against the `firmware` map."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from provisioner.commands.common import Format, unwrap
from provisioner.errors import Exit

HELP = unwrap("""Read every BMC's firmware inventory and compare it with the inventory's `firmware` map.

Hosts with a bmc_address or a firmware map (narrowed by --limit) are read over Redfish (UpdateService/
FirmwareInventory, plus ComputerSystem.BiosVersion and Manager.FirmwareVersion). Where the map names gpu or hca (or
with --node), the node's own report joins in over SSH: nvidia-smi's VBIOS per GPU, each InfiniBand HCA's fw_ver.
Prints the fleet's firmware table, then the findings: FW010 a version not accepted (component, found, wanted,
host), FW011 a wanted component nobody reports, FW012 a BMC that could not be read. The BMC001-005 / FW001-003 rules
run first.

--apply COMPONENT (bios or bmc) updates that firmware instead, opt-in and loud: --image-uri (the site's HTTPS URL the
BMCs fetch it from), --sha256 (the controller downloads the image first, verified against the host's CA bundle or
--image-ca, and refuses everything on a mismatch) and --yes are required. Redfish UpdateService.SimpleUpdate, one
host at a time: each host's new version is waited for (a BMC that resets meanwhile is waited for too) before the
next one starts; the first failure stops the rollout, the hosts after it untouched.

Exit codes: 0 every wanted version found (--apply: every host updated), 1 a mismatch, an invalid map or an
unreadable BMC (--apply: a checksum mismatch or a host not updated), 2 usage.""")


def fetch_sha256(uri: str, ca_file: Path | None, timeout: float = 120.0) -> str:
    """The sha256 of what `uri` serves, TLS verified against `ca_file` or the default CA bundle (the site's trust;
    HTTPS_PROXY/NO_PROXY honoured). OSError / ValueError with the reason."""
    import hashlib
    import ssl
    import urllib.request

    ctx = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    h = hashlib.sha256()
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=ctx))
    with opener.open(uri, timeout=timeout) as resp:  # noqa: S310 (https/http only: checked by the caller)
        for chunk in iter(lambda: resp.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def apply(inventory: Path, component: str, image_uri: str, sha256: str, *, limit: str | None, yes: bool,
          image_ca: Path | None = None, timeout: float = 1800.0, fmt: Format = Format.text,
          vault_password_file: Path | None = None) -> int:
    """`--apply`: the checksum first, then SimpleUpdate host after host, each waited for until its version moved."""
    import time

    from provisioner.bmc.config import BmcConfigError
    from provisioner.bmc.firmware import APPLY_COMPONENTS, sha256_problem
    from provisioner.bmc.redfish import Bmc, BmcError, opt_out_line
    from provisioner.bmc.session import before_after_table, bmc_target, select, setup_vault
    from provisioner.errors import UsageError
    from provisioner.inventory import load_fleet

    if component not in APPLY_COMPONENTS:
        raise UsageError(f"--apply {component!r}: one of {', '.join(APPLY_COMPONENTS)}")
    if not image_uri.startswith(("https://", "http://")):
        raise UsageError(f"--image-uri {image_uri!r}: an https:// URL the BMCs can fetch")
    if sha256_problem(sha256):
        raise UsageError(f"--sha256: {sha256_problem(sha256)}")
    if not yes:
        raise UsageError(f"--apply {component} flashes firmware on every selected host: add --yes")
    if timeout <= 0:
        raise UsageError("--timeout must be > 0")
    fleet = load_fleet(inventory)
    pool = select(fleet, [limit]) if limit else list(fleet.hosts)
    hosts = [h for h in pool if fleet.hosts[h].vars.get("bmc_address")]
    if not hosts:
        raise UsageError(f"no hosts with bmc_address{' in --limit ' + limit if limit else ''}", path=str(inventory))
    say = (lambda m: None) if fmt is Format.json else (lambda m: sys.stderr.write(m + "\n"))
    if image_uri.startswith("http://"):
        say(f"warning: {image_uri} is plain HTTP: the checksum below is the only integrity check")
    try:
        got = fetch_sha256(image_uri, image_ca)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"error: firmware image {image_uri}: {getattr(exc, 'reason', None) or exc}: nothing "
                         "applied\n")
        return int(Exit.FAIL)
    if got != sha256.strip().lower():
        sys.stderr.write(f"error: firmware image {image_uri}: sha256 {got}, expected {sha256.strip().lower()}: "
                         "nothing applied\n")
        return int(Exit.FAIL)
    setup_vault(fleet, hosts, vault_password_file)
    from provisioner import vault

    vault.require(fleet, [h for h in hosts if fleet.hosts[h].vars.get("bmc_address")], what="provision firmware",
                  only=("bmc_password",))  # the BMC password, one line up front (exit 2); nothing else is needed
    rows: list[dict[str, Any]] = [{"host": h, "status": "not started", "before": None, "after": None, "error": None}
                                  for h in hosts]
    for i, (h, row) in enumerate(zip(hosts, rows, strict=True), start=1):
        say(f"firmware: APPLYING {component} image {image_uri} (sha256 {got[:12]}...) to {h} through its BMC "
            f"[{i}/{len(hosts)}]")
        try:
            t = bmc_target(fleet, h)
            warn = opt_out_line(t)
            if warn:
                say(warn)
            bmc = Bmc(t)
            before = bmc.firmware().versions().get(component, [])
            row["before"] = ", ".join(before) or None
            bmc.simple_update(image_uri, component)
            deadline, after, why = time.monotonic() + timeout, before, "no new version yet"
            while after == before:
                if time.monotonic() > deadline:
                    raise BmcError(f"{h}: {component} still reports {row['before']} {timeout:g} s after the update "
                                   f"was accepted ({why})")
                time.sleep(2.0)
                try:  # a BMC that resets after the update does not answer for a while: wait for it
                    after = Bmc(t, timeout=10.0).firmware().versions().get(component, [])
                except BmcError as exc:
                    why = str(exc)
            row.update(status="updated", after=", ".join(after))
            say(f"firmware: {h}: {component} {row['before']} -> {row['after']}")
        except (BmcConfigError, BmcError) as exc:
            row.update(status="failed", error=str(exc) if str(exc).startswith(h) else f"{h}: {exc}")
            break
    ok = all(r["status"] == "updated" for r in rows)
    if fmt is Format.json:
        sys.stdout.write(json.dumps({"ok": ok, "component": component, "image_uri": image_uri, "sha256": got,
                                     "hosts": rows}, indent=2) + "\n")
    else:
        before_after_table(f"firmware --apply {component}", rows, "status",
                           lambda r: "[red]failed[/]" if r["status"] == "failed" else r["status"])
    for r in rows:
        if r["error"]:
            sys.stderr.write(f"error: {r['error']} (the rollout stopped here)\n")
    return int(Exit.OK if ok else Exit.FAIL)


def run(inventory: Path, limit: str | None = None, fmt: Format = Format.text, forks: int = 16,
        vault_password_file: Path | None = None, node: bool = False) -> int:
    from provisioner.bmc.config import BmcConfigError
    from provisioner.bmc.firmware import FirmwareFinding, HostFirmware, compare, merged, node_part, wanted_map
    from provisioner.bmc.redfish import Bmc, BmcError, opt_out_line
    from provisioner.bmc.session import bmc_target, each, select, setup_vault
    from provisioner.errors import UsageError
    from provisioner.inventory import load_fleet
    from provisioner.probes.firmware import read_nodes
    from provisioner.rules import run_rules

    if forks < 1:
        raise UsageError("--forks must be >= 1")
    fleet = load_fleet(inventory)
    pool = select(fleet, [limit]) if limit else list(fleet.hosts)
    hosts = [h for h in pool if fleet.hosts[h].vars.get("bmc_address") or "firmware" in fleet.hosts[h].vars]
    if not hosts:
        raise UsageError(f"no hosts with bmc_address or firmware{' in --limit ' + limit if limit else ''}",
                         path=str(inventory))
    scope = set(hosts)
    invalid = [f for f in run_rules(fleet) if f.code.startswith(("BMC", "FW")) and f.severity == "error"
               and (f.host is None or f.host in scope)]
    setup_vault(fleet, hosts, vault_password_file)
    from provisioner import vault

    vault.require(fleet, [h for h in hosts if fleet.hosts[h].vars.get("bmc_address")], what="provision firmware",
                  only=("bmc_password",))  # the BMC password, one line up front (exit 2); nothing else is needed
    wanted = {h: wanted_map(fleet.hosts[h].vars.get("firmware")) for h in hosts}
    node_hosts = [h for h in hosts if node or node_part(wanted[h])]

    def one(host: str) -> HostFirmware:
        if not fleet.hosts[host].vars.get("bmc_address") and host in node_hosts:
            return HostFirmware(host)  # no BMC: the node's own report only
        try:
            t = bmc_target(fleet, host)
        except BmcConfigError as exc:
            return HostFirmware(host, error=f"{host}: {exc}")
        warn = opt_out_line(t)
        if warn:
            sys.stderr.write(warn + "\n")
        try:
            return Bmc(t).firmware()
        except BmcError as exc:
            return HostFirmware(host, error=str(exc))

    results = each(hosts, one, forks)
    nodes = read_nodes(fleet, node_hosts)
    reports: dict[str, HostFirmware] = {}
    for h in hosts:
        r = results[h]
        reports[h] = r if isinstance(r, HostFirmware) else HostFirmware(h, error=f"{h}: {type(r).__name__}: {r}")
        if h in nodes:
            reports[h] = merged(reports[h], *nodes[h])
    findings: list[FirmwareFinding] = []
    for h in hosts:
        findings.extend(compare(reports[h], wanted[h]))
    ok = not findings and not invalid
    if fmt is Format.json:
        doc: dict[str, Any] = {
            "ok": ok,
            "errors": [f.as_dict() for f in invalid],
            "hosts": {h: {"error": reports[h].error, "node_error": reports[h].node_error,
                          "wanted": {c: list(v) for c, v in wanted[h].items()},
                          "items": [{"component": i.component, "id": i.id, "name": i.name, "version": i.version,
                                     "source": i.source} for i in reports[h].items]} for h in hosts},
            "findings": [f.as_dict() for f in findings],
        }
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        _print_text(hosts, reports, wanted, findings, [f.line() for f in invalid])
    return int(Exit.OK if ok else Exit.FAIL)


def _print_text(hosts: list[str], reports: dict[str, Any], wanted: dict[str, Any], findings: list[Any],
                invalid: list[str]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    out = Console(highlight=False, soft_wrap=True)
    bad = {(f.host, f.component) for f in findings}
    table = Table(title="firmware", title_justify="left")
    for col in ("host", "component", "version", "from", "wanted", "status"):
        table.add_column(col)
    for h in hosts:
        rep = reports[h]
        if rep.error and not rep.items:
            table.add_row(escape(h), "-", "-", "-", "-", "[red]unreadable[/]")
            continue
        comps = rep.versions()
        for c in sorted(set(comps) | set(wanted[h])):
            want = wanted[h].get(c)
            status = "[red]mismatch[/]" if (h, c) in bad else ("ok" if want else "-")
            src = sorted({"node" if i.source == "node" else "bmc" for i in rep.items if i.component == c})
            table.add_row(escape(h), escape(c), escape(", ".join(comps.get(c, [])) or "(not reported)"),
                          "+".join(src) or "-", escape(" or ".join(want or ()) or "-"), status)
    out.print(table)
    for line in invalid:
        out.print(escape(line))
    for f in findings:
        out.print(escape(f.line()))
    n = len(findings) + len(invalid)
    out.print(f"{len(hosts)} host(s): {'firmware as wanted' if not n else f'{n} finding(s)'}")


def register(app: typer.Typer) -> None:
    @app.command("firmware", help=HELP)
    def firmware_cmd(
        inventory: Annotated[Path, typer.Argument(help="Inventory file or directory.", show_default=False)],
        limit: Annotated[str | None, typer.Option("--limit", "-l", help="Hosts/groups/globs, Ansible style.")] = None,
        fmt: Annotated[Format, typer.Option("--format", "-f", help="Table (text) or JSON.")] = Format.text,
        forks: Annotated[int, typer.Option("--forks", help="BMCs read at once.")] = 16,
        vault_password_file: Annotated[Path | None, typer.Option(
            "--vault-password-file", help="For vaulted bmc_password values (else ANSIBLE_VAULT_PASSWORD_FILE).",
            show_default=False)] = None,
        node: Annotated[bool, typer.Option(
            "--node", help="Also read every host's own report over SSH (VBIOS, HCA fw_ver), not only where the map "
                           "names gpu or hca.")] = False,
        apply_: Annotated[str | None, typer.Option(
            "--apply", help="Update this component (bios, bmc) instead of reading: needs --image-uri, --sha256, --yes.",
            show_default=False)] = None,
        image_uri: Annotated[str | None, typer.Option(
            "--image-uri", help="With --apply: the image's URL, fetched by the BMCs.", show_default=False)] = None,
        sha256: Annotated[str | None, typer.Option(
            "--sha256", help="With --apply: the image's sha256 (checked by the controller first).",
            show_default=False)] = None,
        image_ca: Annotated[Path | None, typer.Option(
            "--image-ca", help="With --apply: CA bundle for the image server (default: the host's).",
            show_default=False)] = None,
        yes: Annotated[bool, typer.Option("--yes", help="With --apply: confirm the flash.")] = False,
        timeout: Annotated[float, typer.Option(
            "--timeout", help="With --apply: seconds per host for the new version to show.")] = 1800.0,
    ) -> None:
        from provisioner.errors import UsageError

        if apply_ is not None:
            if not image_uri or not sha256:
                raise UsageError("--apply needs --image-uri and --sha256")
            raise typer.Exit(apply(inventory, apply_, image_uri, sha256, limit=limit, yes=yes, image_ca=image_ca,
                                   timeout=timeout, fmt=fmt, vault_password_file=vault_password_file))
        if image_uri or sha256 or yes or image_ca:
            raise UsageError("--image-uri, --sha256, --image-ca and --yes go with --apply")
        raise typer.Exit(run(inventory, limit, fmt, forks, vault_password_file, node))
