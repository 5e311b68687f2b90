"""Throwaway PKI for the TLS tests, made with `cryptography`: a CA, a server cert for 127.0.0.1, a client cert."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

NOT_BEFORE = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
NOT_AFTER = dt.datetime(2036, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA nobody here trusts


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _ca(cn: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOT_BEFORE)
        .not_valid_after(NOT_AFTER)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(cn: str, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, server: bool) -> tuple[bytes, bytes]:
    key = _key()
    b = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOT_BEFORE)
        .not_valid_after(NOT_AFTER)
    )
    if server:
        b = b.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False,
        )
    cert = b.sign(ca_key, hashes.SHA256())
    pem_key = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), pem_key


def make_pki(d: Path) -> Pki:
    d.mkdir(parents=True, exist_ok=True)
    ca, ca_key = _ca("feedlog test CA")
    other, _ = _ca("someone else's CA")
    files = {
        "ca.pem": ca.public_bytes(serialization.Encoding.PEM),
        "other-ca.pem": other.public_bytes(serialization.Encoding.PEM),
    }
    files["server.pem"], files["server.key"] = _leaf("127.0.0.1", ca, ca_key, server=True)
    files["client.pem"], files["client.key"] = _leaf("a client", ca, ca_key, server=False)
    for name, data in files.items():
        (d / name).write_bytes(data)
    return Pki(d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem", d / "client.key", d / "other-ca.pem")
