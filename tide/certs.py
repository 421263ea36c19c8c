"""Throwaway certificates for a local cluster (``tide up --tls``) and for tests.

A self-signed CA and leaf certificates it signs, usable both as server and as client
certificates (serverAuth + clientAuth), valid for the given DNS names and IP addresses.
Keys are EC P-256 (fast handshakes); files are PEM, keys readable by the owner only.
Not for production: see docs/security.md for real certificates (cert-manager).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_VALID_DAYS = 30
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True, slots=True)
class CertificateAuthority:
    cert_file: Path
    key_file: Path


@dataclass(frozen=True, slots=True)
class LeafFiles:
    cert_file: Path
    key_file: Path
    ca_file: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    os.replace(tmp, path)  # a reloading server never sees half a file


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    os.replace(tmp, path)


def _validity(days: int) -> tuple[datetime.datetime, datetime.datetime]:
    now = datetime.datetime.now(datetime.UTC)
    return now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)


def make_ca(
    directory: Path, name: str = "tide-ca", days: int = DEFAULT_VALID_DAYS
) -> CertificateAuthority:
    """A self-signed CA: ``directory/NAME.crt`` and ``NAME.key``."""
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = _validity(days)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    authority = CertificateAuthority(directory / f"{name}.crt", directory / f"{name}.key")
    _write_key(authority.key_file, key)
    _write_cert(authority.cert_file, cert)
    return authority


def _subject_names(hosts: tuple[str, ...]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def make_leaf(
    authority: CertificateAuthority,
    directory: Path,
    name: str,
    hosts: tuple[str, ...] = LOCAL_HOSTS,
    days: int = DEFAULT_VALID_DAYS,
) -> LeafFiles:
    """``directory/NAME.crt`` + ``NAME.key`` signed by ``authority``, for ``hosts``; usable
    as a server and as a client certificate. Files are replaced atomically."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert = x509.load_pem_x509_certificate(authority.cert_file.read_bytes())
    ca_key = serialization.load_pem_private_key(authority.key_file.read_bytes(), None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{authority.key_file}: expected an EC key")
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = _validity(days)
    usage = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(_subject_names(hosts)), critical=False)
        .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    leaf = LeafFiles(directory / f"{name}.crt", directory / f"{name}.key", authority.cert_file)
    _write_key(leaf.key_file, key)
    _write_cert(leaf.cert_file, cert)
    return leaf


def certificate_serial(path: Path) -> int:
    """The serial number of the PEM certificate at ``path``."""
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


def peer_serial(der: bytes) -> int:
    """The serial number of a DER certificate (e.g. what a TLS handshake presented)."""
    return x509.load_der_x509_certificate(der).serial_number
