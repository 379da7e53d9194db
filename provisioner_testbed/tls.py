"""A rack's own small CA and one server certificate it signed for an IP address (kept across restarts): the BMC
emulator's (127.0.0.1) and the stand-in repository's (the bridge address), as a site's internal CA would sign its
mirrors, and more certificates it issues later (the air-gapped site's bundle mirror, `issue`). The CA goes to the nodes
as `site_ca_certificates`; the private keys never leave the rack directory (or the vaulted inventory that asks)."""

from __future__ import annotations

import datetime
import os
from pathlib import Path


def _write_key(path: Path, key: object) -> None:
    from cryptography.hazmat.primitives import serialization

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()))


def ensure(d: Path, address: str, ca_label: str) -> None:
    """`d/ca.pem`, `d/ca.key` (0600, for `issue`), `d/server.pem` (SAN: `address`) and `d/server.key` (0600), made
    once."""
    if (d / "ca.pem").is_file() and (d / "server.pem").is_file():
        return
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ca_label)])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=365))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    _write_key(d / "ca.key", ca_key)
    (d / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    issue(d, address, d)


def issue(ca_dir: Path, address: str, out: Path) -> tuple[str, str]:
    """A server certificate for the IP `address` signed by the CA in `ca_dir` (`ensure`'s), written to
    `out/server.pem` and `out/server.key` (0600) unless there already; returns (certificate PEM, key PEM)."""
    if (out / "server.pem").is_file() and (out / "server.key").is_file():
        return (out / "server.pem").read_text(), (out / "server.key").read_text()
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if not (ca_dir / "ca.key").is_file():
        raise RuntimeError(f"{ca_dir}: no ca.key (a rack made before its CA could issue more certificates): take the "
                           "rack down and bring it up again")
    ca_key = serialization.load_pem_private_key((ca_dir / "ca.key").read_bytes(), password=None)
    ca = x509.load_pem_x509_certificate((ca_dir / "ca.pem").read_bytes())
    ca_name = ca.subject
    now = datetime.datetime.now(datetime.UTC)
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, address)]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(address))]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    _write_key(out / "server.key", key)
    (out / "server.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return (out / "server.pem").read_text(), (out / "server.key").read_text()
