"""Pure parts of the testbed: proxy config, the repo server's path mapping, process identity, the base recipe."""

from __future__ import annotations

from pathlib import Path

from provisioner_testbed import proxy, rootfs, serve
from provisioner_testbed.state import HostState, Proc, RackState


def test_proxy_config_listens_on_the_bridge_and_allows_only_the_rack() -> None:
    conf = proxy.render_config("198.18.3.1", "198.18.3.0/24", Path("/w"))
    lines = conf.splitlines()
    assert "Listen 198.18.3.1" in lines and "Port 3128" in lines
    assert [ln for ln in lines if ln.startswith("Allow")] == ["Allow 198.18.3.0/24"]
    assert "FilterDefaultDeny Yes" in lines
    assert proxy.render_filter(("deb.debian.org",)) == "^deb\\.debian\\.org$\n"


def test_repo_server_maps_prefixes_and_refuses_escapes(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "pool").mkdir(parents=True)
    m = {"/nvidia/": repo}
    assert serve.resolve_path(m, "/nvidia/InRelease") == repo.resolve() / "InRelease"
    assert serve.resolve_path(m, "/nvidia/pool/a%20b.deb?x=1") == repo.resolve() / "pool" / "a b.deb"
    assert serve.resolve_path(m, "/nvidia/../etc/passwd") is None
    assert serve.resolve_path(m, "/nvidia/%2e%2e/etc/passwd") is None
    assert serve.resolve_path(m, "/other/x") is None


def test_rack_state_round_trips(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PROVISIONER_TESTBED_STATE", str(tmp_path))
    st = RackState(name="ci", index=3, bridge="pvbr3", gateway="198.18.3.1", prefix=24, nodes=1,
                   hosts=[HostState(name="node01", machine="pv3-01", address="198.18.3.11", index=1, nspawn=[5, 6])])
    st.save()
    back = RackState.load("ci")
    assert back == st and back.hosts[0].proc == Proc(5, 6)
    (tmp_path / "racks" / "ci" / "state.json").write_text("{broken")
    assert RackState.load("ci") is None


def test_base_recipe_has_the_required_packages_and_a_stable_hash(tmp_path: Path) -> None:
    for pkg in ("systemd", "systemd-sysv", "openssh-server", "python3", "iproute2", "sudo", "dbus",
                "ca-certificates", "gnupg"):
        assert pkg in rootfs.PACKAGES
    assert rootfs.recipe_hash() == rootfs.recipe_hash()
    assert rootfs.base_path(tmp_path).parent == tmp_path
    assert not rootfs.is_ready(tmp_path)
