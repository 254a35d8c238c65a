"""The mesh's own certificate authority and its nodes' certificate, for TLS on NATS.

`fleet up --cluster N` makes them at first start under `<data dir>/tls` (kept across restarts):
a CA (EC P-256, ten years) and one certificate for the nodes, signed by it, naming the
loopback address and `localhost` (the nodes listen there) for both server and client use, so a
route between two nodes is verified both ways. Clients trust the CA only (`FLEET_NATS_CA`)
and check the node's name against the URL they dialled. The keys are written 0600 from their
first byte; the CA's key never leaves the directory.
"""

import datetime
import ipaddress
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_ENV = "FLEET_NATS_CA"
"""The CA certificate a process trusts for its NATS connections (TLS on when set)."""

NAMES = ("localhost",)
ADDRESSES = ("127.0.0.1",)


_CLIENT = ExtendedKeyUsageOID.CLIENT_AUTH
_CA_USAGE = x509.KeyUsage(
    digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
    key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
    decipher_only=False,
)  # fmt: skip


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    cert: Path
    key: Path

    def server_block(self, *, verify: bool) -> str:
        """A `tls { … }` block of nats-server's configuration (`verify`: the peer must show a
        certificate of this CA too: routes)."""
        lines = [
            f'  cert_file: "{self.cert}"',
            f'  key_file: "{self.key}"',
            f'  ca_file: "{self.ca}"',
            "  timeout: 5",
        ]
        if verify:
            lines.append("  verify: true")
        return "tls {\n" + "\n".join(lines) + "\n}\n"


def ensure_tls(directory: Path) -> TlsFiles:
    """The CA and the nodes' certificate under `directory`, made when missing."""
    files = TlsFiles(directory / "ca.pem", directory / "node.pem", directory / "node-key.pem")
    if files.ca.exists() and files.cert.exists() and files.key.exists():
        return files
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fleet-rlm mesh CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_CA_USAGE, critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    node_key = ec.generate_private_key(ec.SECP256R1())
    alt_names: list[x509.GeneralName] = [x509.DNSName(n) for n in NAMES]
    alt_names += [x509.IPAddress(ipaddress.ip_address(a)) for a in ADDRESSES]
    node = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fleet-rlm nats node")]))
        .issuer_name(ca_name)
        .public_key(node_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=825))
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    _write(directory / "ca-key.pem", _pem_key(ca_key))
    _write(files.key, _pem_key(node_key))
    _write(files.cert, node.public_bytes(serialization.Encoding.PEM))
    _write(files.ca, ca.public_bytes(serialization.Encoding.PEM))
    return files


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes) -> None:
    path.unlink(missing_ok=True)  # a half-made set is made again whole
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def client_context(ca: Path) -> ssl.SSLContext:
    """A client's TLS: this CA only, the node's name checked against the URL dialled."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context
