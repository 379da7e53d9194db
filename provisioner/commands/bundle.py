"""`provision bundle build|verify`: the air-gapped bundle (docs/airgap.md)."""

from __future__ import annotations

import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from provisioner.commands.common import EXTRA_VARS_HELP, VAULT_HELP, extra_vars, unwrap, use_vault
from provisioner.errors import Exit

err = Console(stderr=True, highlight=False, soft_wrap=True)


class Release(str, Enum):
    debian12 = "debian12"
    ubuntu2204 = "ubuntu2204"
    ubuntu2404 = "ubuntu2404"


BUILD_HELP = unwrap("""Fetch everything the inventory's hosts will download into DIR, for a site with no route out.

From the inventory (the same roles, defaults and variables a run uses): the pinned NVIDIA packages and the Debian
packages the roles install, each with its full dependency closure per --release, resolved by apt in a root of its
own; the vLLM wheels for the pinned vLLM and the nodes' Python; the EFA installers the inventory names (sha256
checked); this suite's wheel, its dependencies and its collection. DIR/apt/<release>/ is a flat apt repository
signed with the bundle key (kept in --key-home, never in DIR), DIR/python/simple/ a PEP 503 index, DIR/manifest.json
lists every artifact (version, sha256, origin, roles). A second build into the same DIR fetches only what changed and
prints the difference. With --mirror-url https://HOST:PORT/, DIR/site-vars.yml holds the inventory variables that point
the roles at a mirror serving DIR over TLS (role bundle_mirror; its CA in site_ca_certificates). A plain-HTTP mirror
URL is refused: pip will not use a plain-HTTP index.

Exit codes: 0 built, 1 a fetch or the resolution failed, 2 usage (unreadable inventory, unknown release, an
http:// --mirror-url).""")

VERIFY_HELP = unwrap("""Check a bundle's checksums and signatures, and that it holds what INVENTORY needs.

Every artifact's size and sha256 against manifest.json, each apt repository's InRelease against the key the bundle
carries (its fingerprint pinned in the manifest) and its Packages against the manifest; with INVENTORY, every
package, wheel and file the inventory's hosts need (each missing one named with its version, role and hosts).

Exit codes: 0 intact (and complete), 1 a problem found, 2 usage (no manifest, unreadable inventory).""")


def _default_key_home() -> Path:
    import os

    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "provisioner" / "bundle-key"


def _site_cas(fleet: Any) -> list[str]:
    """The inventory's site_ca_certificates (PEM texts) over its GPU nodes: the mirrors the build fetches from may be
    behind the site's own CA, as the nodes see them."""
    out: list[str] = []
    for h in fleet.hosts.values():
        for pem in h.vars.get("site_ca_certificates") or []:
            if isinstance(pem, str) and pem.strip() not in out:
                out.append(pem.strip())
    return out


def register(app: typer.Typer) -> None:
    group = typer.Typer(name="bundle", help="The air-gapped bundle: build, verify (docs/airgap.md).",
                        no_args_is_help=True)

    @group.command("build", help=BUILD_HELP)
    def build_cmd(
        inventory: Annotated[Path, typer.Argument(help="The inventory the bundle is for.", show_default=False)],
        out: Annotated[Path, typer.Option("--out", help="The bundle directory (created; an earlier build in it is "
                                                        "updated).", show_default=False)],
        release: Annotated[list[Release] | None, typer.Option(
            "--release", help="OS release of the nodes (repeat for several).")] = None,
        kernel: Annotated[str, typer.Option("--kernel", help="The nodes' kernel (linux-headers-KERNEL, when "
                                                             "nvidia_driver_install_headers).")] = "",
        apt_source: Annotated[list[str] | None, typer.Option(
            "--apt-source", help="A sources.list line for the distribution's packages (repeat; replaces the "
                                 "release's Debian/Ubuntu mirror).")] = None,
        pip_index_url: Annotated[str, typer.Option("--pip-index-url", help="Where pip fetches wheels.")] = "",
        find_links: Annotated[list[Path] | None, typer.Option("--find-links", help="A local wheel directory.")] = None,
        no_index: Annotated[bool, typer.Option("--no-index", help="pip uses --find-links only.")] = False,
        suite_wheel: Annotated[Path | None, typer.Option("--suite-wheel", help="This suite's wheel (default: built "
                                                                               "from the checkout).")] = None,
        no_suite: Annotated[bool, typer.Option("--no-suite", help="Leave out the suite's wheel and collection.")]
        = False,
        mirror_url: Annotated[str, typer.Option("--mirror-url", help="Where the mirror will serve DIR, "
                                                                     "https://HOST:PORT/ (writes DIR/site-vars.yml)."
                                                                     )] = "",
        key_home: Annotated[Path | None, typer.Option("--key-home", help="GnuPG home of the bundle signing key "
                                                                         "(default ~/.local/share/provisioner/"
                                                                         "bundle-key).")] = None,
        extra: Annotated[list[str] | None, typer.Option("--extra-vars", "-e", help=EXTRA_VARS_HELP)] = None,
        vault_password_file: Annotated[Path | None, typer.Option("--vault-password-file", help=VAULT_HELP)] = None,
    ) -> None:
        use_vault(vault_password_file)
        from provisioner.bundle import build as b
        from provisioner.bundle.needs import fleet_needs, repo_settings
        from provisioner.inventory import load_fleet

        b.check_mirror_url(mirror_url)
        rels = [r.value for r in (release or [Release.debian12])]
        fleet = load_fleet(inventory, extra_vars(extra))
        needs = fleet_needs(fleet, rels, kernel)
        gpu = [h for _, h in sorted(fleet.hosts.items()) if "gpu_nodes" in h.groups]
        repos = {rel: [repo_settings(fleet, h, rel) for h in gpu] for rel in rels}
        t0 = time.monotonic()
        opts = b.Options(out=out, releases=rels, key_home=key_home or _default_key_home(),
                         apt_sources=apt_source or (), pip_index_url=pip_index_url, find_links=find_links or (),
                         no_index=no_index, suite_wheel=suite_wheel, suite=not no_suite, mirror_url=mirror_url,
                         ca_pems=_site_cas(fleet), log=lambda s: err.print(escape(s)))
        try:
            res = b.build(needs, repos, opts)
        except b.BundleError as exc:  # a source that failed or a resolution apt refused: not a usage error
            err.print(f"error: {escape(str(exc))}")
            raise typer.Exit(int(Exit.FAIL)) from None
        size = sum(a.size for a in res.artifacts)
        for line in res.diff:
            print(line)
        err.print(f"bundle {escape(str(out))}: {len(res.artifacts)} artifacts, {size / 1e6:.1f} MB, "
                  f"{len(res.fetched)} fetched, {len(res.diff)} changed, {time.monotonic() - t0:.1f} s")
        print(f"signing key fingerprint: {res.fingerprint}")

    @group.command("verify", help=VERIFY_HELP)
    def verify_cmd(
        bundle: Annotated[Path, typer.Argument(help="The bundle directory.", show_default=False)],
        inventory: Annotated[Path | None, typer.Argument(help="Check completeness against this inventory.",
                                                         show_default=False)] = None,
        kernel: Annotated[str, typer.Option("--kernel", help="The nodes' kernel, as at build.")] = "",
        extra: Annotated[list[str] | None, typer.Option("--extra-vars", "-e", help=EXTRA_VARS_HELP)] = None,
        vault_password_file: Annotated[Path | None, typer.Option("--vault-password-file", help=VAULT_HELP)] = None,
    ) -> None:
        from provisioner.bundle.verify import check, read

        needs = None
        doc, arts = read(bundle)
        if inventory is not None:
            use_vault(vault_password_file)
            from provisioner.bundle.needs import fleet_needs
            from provisioner.inventory import load_fleet

            needs = fleet_needs(load_fleet(inventory, extra_vars(extra)), doc.get("releases") or ["debian12"], kernel)
        problems = check(bundle, needs)
        for p in problems:
            err.print(f"[red]error[/] {escape(str(bundle))}: {escape(p)}")
        if problems:
            raise typer.Exit(int(Exit.FAIL))
        err.print(f"bundle {escape(str(bundle))}: {len(arts)} artifacts intact, signatures good"
                  + (f", complete for {escape(str(inventory))}" if inventory else ""))

    app.add_typer(group)
