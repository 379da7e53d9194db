"""`provision power` and `provision firmware` as real processes against a real Redfish service: sushy-tools'
emulator (fake driver: no libvirt; power changes land 1-11 s after the request), on 127.0.0.1, HTTPS with a
certificate from a CA made here (bmc_ca_file), HTTP basic auth. A second host's BMC is a closed port: one line,
exit 1, the first host still done. The BMC password must appear in no output."""

from __future__ import annotations

import datetime
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from inventory_factory import write_inventory
from provisioner import PROJECT_ROOT

pytest.importorskip("sushy")
pytest.importorskip("bcrypt")
EMULATOR = shutil.which("sushy-emulator", path=str(Path(sys.executable).parent)) or shutil.which("sushy-emulator")
if EMULATOR is None:
    pytest.skip("sushy-tools is not installed (pip install -e '.[test]')", allow_module_level=True)

PASSWORD = "Emu-s3cret-9x"
UUID = "27946b59-9e44-4fa7-8e91-f3527a1ef094"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tls(d: Path) -> tuple[Path, Path, Path]:
    """(ca.pem, server cert, server key): a CA and a 127.0.0.1 server certificate it signed."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test BMC CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(now + datetime.timedelta(1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])).issuer_name(ca_name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = d / "ca.pem", d / "bmc.pem", d / "bmc.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


@pytest.fixture(scope="module")
def bmc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    import bcrypt

    d = tmp_path_factory.mktemp("bmc")
    ca, cert, key = _tls(d)
    (d / "htpasswd").write_text(f"admin:{bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()}\n")
    (d / "emulator.conf").write_text(
        f"SUSHY_EMULATOR_FAKE_DRIVER = True\nSUSHY_EMULATOR_STATE_DIR = {str(d / 'state')!r}\n"
        f"SUSHY_EMULATOR_AUTH_FILE = {str(d / 'htpasswd')!r}\n"
        f"SUSHY_EMULATOR_FAKE_SYSTEMS = [{{'uuid': {UUID!r}, 'name': 'n1', 'power_state': 'On', "
        "'nics': [{'mac': '00:5c:52:31:3a:9c', 'ip': '172.22.0.100'}]}]\n")
    port = _free_port()
    log = (d / "emulator.log").open("w")
    p = subprocess.Popen([str(EMULATOR), "--config", str(d / "emulator.conf"), "-i", "127.0.0.1", "-p", str(port),
                          "--ssl-certificate", str(cert), "--ssl-key", str(key)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if p.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("sushy-emulator did not start: " + (d / "emulator.log").read_text()[-2000:])
                time.sleep(0.2)
        yield port, ca
    finally:
        p.terminate()
        p.wait(timeout=10)
        log.close()


def _inventory(tmp_path: Path, port: int, ca: Path, bmc_fw: str = "1.00") -> Path:
    ini = "[gpu_nodes]\nn1 ansible_host=10.0.0.1\nn2 ansible_host=10.0.0.2\n\n[c1]\nn1 node_rank=0\nn2 node_rank=1\n"
    closed = _free_port()
    return write_inventory(tmp_path, ini=ini, group_vars={"gpu_nodes": {
        "bmc_username": "admin", "bmc_password_env": "TEST_BMC_PASSWORD", "bmc_ca_file": str(ca),
        "firmware": {"bmc": [bmc_fw]}}}, host_vars={
        "n1": {"bmc_address": "127.0.0.1", "bmc_port": port},
        "n2": {"bmc_address": "127.0.0.1", "bmc_port": closed}})


def provision(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TEST_BMC_PASSWORD": PASSWORD, "PYTHONPATH": str(PROJECT_ROOT)}
    p = subprocess.run([sys.executable, "-m", "provisioner.cli", *args], capture_output=True, text=True, env=env,
                       cwd=PROJECT_ROOT, timeout=120)
    assert PASSWORD not in p.stdout + p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    return p


def test_power_status_off_on(bmc: tuple[int, Path], tmp_path: Path) -> None:
    port, ca = bmc
    inv = str(_inventory(tmp_path, port, ca))
    p = provision("power", inv, "n1", "status", "--format", "json")
    assert p.returncode == 0, p.stderr
    (row,) = json.loads(p.stdout)["hosts"]
    assert row["host"] == "n1" and row["before"] == row["after"] == "On"

    assert provision("power", inv, "n1", "off").returncode == 2  # no --yes
    p = provision("power", inv, "n1", "off", "--yes", "--timeout", "30", "--format", "json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["hosts"][0]["after"] == "Off"
    p = provision("power", inv, "n1", "n2", "on", "--boot", "pxe", "--timeout", "30", "--format", "json",
                  "--no-wait-ssh")  # the emulator's fake systems have no OS
    # n2's BMC is a closed port: one line, exit 1; n1 is still powered on
    assert p.returncode == 1
    rows = {r["host"]: r for r in json.loads(p.stdout)["hosts"]}
    assert rows["n1"]["ok"] and rows["n1"]["after"] == "On"
    assert not rows["n2"]["ok"] and "unreachable" in rows["n2"]["error"]
    (line,) = [x for x in p.stderr.splitlines() if x.startswith("error:")]
    assert "n2" in line and "connection refused" in line


def test_firmware_table_and_mismatch(bmc: tuple[int, Path], tmp_path: Path) -> None:
    port, ca = bmc
    p = provision("firmware", str(_inventory(tmp_path / "ok", port, ca)), "--limit", "n1", "--format", "json")
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(p.stdout)
    assert doc["ok"] and doc["findings"] == []
    assert [i["version"] for i in doc["hosts"]["n1"]["items"] if i["component"] == "bmc"] == ["1.00"]

    p = provision("firmware", str(_inventory(tmp_path / "bad", port, ca, bmc_fw="2.10")))
    assert p.returncode == 1
    assert "FW010 n1 (bmc): found 1.00, wanted 2.10" in p.stdout, p.stdout
    assert "FW012 n2" in p.stdout and "mismatch" in p.stdout


def test_tls_is_verified_against_the_system_bundle_without_bmc_ca_file(bmc: tuple[int, Path],
                                                                         tmp_path: Path) -> None:
    port, _ = bmc
    inv = write_inventory(tmp_path, host_vars={"n1": {"bmc_address": "127.0.0.1", "bmc_port": port,
                                                      "bmc_username": "admin",
                                                      "bmc_password_env": "TEST_BMC_PASSWORD"}})
    p = provision("power", str(inv), "n1", "status")
    assert p.returncode == 1 and "TLS verification failed" in p.stderr, p.stderr
    # the per-host opt-out works and is loud
    inv = write_inventory(tmp_path / "optout", host_vars={"n1": {"bmc_address": "127.0.0.1", "bmc_port": port,
                                                                 "bmc_username": "admin", "bmc_tls_verify": False,
                                                                 "bmc_password_env": "TEST_BMC_PASSWORD"}})
    p = provision("power", str(inv), "n1", "status")
    assert p.returncode == 0 and "TLS verification of BMC https://127.0.0.1" in p.stderr, p.stderr


def test_a_vaulted_bmc_password_from_each_vault_source(bmc: tuple[int, Path], tmp_path: Path) -> None:
    """bmc_password as an `ansible-vault encrypt_string` value (docs/bmc.md): decrypted with the vault password from
    --vault-password-file or ANSIBLE_VAULT_PASSWORD_FILE; without one, one line naming it (exit 2), nothing sent."""
    from ansible.parsing.vault import VaultLib, VaultSecret

    port, ca = bmc
    cipher = VaultLib([("default", VaultSecret(b"bmc-vault-pw"))]).encrypt(PASSWORD).decode()
    vaulted = "bmc_password: !vault |\n" + "".join(f"  {ln}\n" for ln in cipher.splitlines())
    inv = str(write_inventory(tmp_path / "inv", group_vars={"gpu_nodes": {"bmc_username": "admin",
                                                                           "bmc_ca_file": str(ca)}},
                              files={"host_vars/n1.yml": vaulted + f"bmc_address: 127.0.0.1\nbmc_port: {port}\n"}))
    pw = tmp_path / "vault-pass"
    pw.write_text("bmc-vault-pw\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_VAULT")}

    def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        p = subprocess.run([sys.executable, "-m", "provisioner.cli", *args], capture_output=True, text=True,
                           env={**base, "PYTHONPATH": str(PROJECT_ROOT), **env}, cwd=PROJECT_ROOT, timeout=120)
        assert PASSWORD not in p.stdout + p.stderr and "bmc-vault-pw" not in p.stdout + p.stderr
        assert "Traceback" not in p.stderr, p.stderr
        return p

    for p in (run("power", inv, "n1", "status", "--format", "json", "--vault-password-file", str(pw)),
              run("power", inv, "n1", "status", "--format", "json", ANSIBLE_VAULT_PASSWORD_FILE=str(pw)),
              run("firmware", inv, "--limit", "n1", "--format", "json", ANSIBLE_VAULT_PASSWORD_FILE=str(pw))):
        assert p.returncode == 0, p.stdout + p.stderr
    p = run("power", inv, "n1", "status")
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0, p.stderr
    assert "bmc_password on host n1 is vaulted and no vault password given: provision power needs it" in p.stderr
