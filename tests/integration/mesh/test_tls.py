"""TLS on NATS from the mesh's own CA (issue 24, item 2): the node's certificate names the
loopback address it listens on, a client trusting the CA gets in over TLS, a client trusting
another CA or none is refused at once, naming what to set."""

import asyncio
import ipaddress
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from fleet_mesh.connection import PermissionRefused, connect
from fleet_mesh.natsserver import NatsServer, Routes
from fleet_mesh.tls import TlsFiles, ensure_tls


def test_the_node_certificate_is_the_cas_and_names_loopback_for_both_uses(tmp_path: Path) -> None:
    files = ensure_tls(tmp_path / "tls")
    ca = x509.load_pem_x509_certificate(files.ca.read_bytes())
    node = x509.load_pem_x509_certificate(files.cert.read_bytes())
    assert node.issuer == ca.subject
    node.verify_directly_issued_by(ca)  # raises unless the CA's key signed it
    names = node.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in names.get_values_for_type(x509.IPAddress)
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    usage = node.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usage) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    for key in (files.key, tmp_path / "tls" / "ca-key.pem"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    # made once: a restarted mesh keeps its CA, so its clients keep trusting it
    assert ensure_tls(tmp_path / "tls") == files
    assert x509.load_pem_x509_certificate(files.ca.read_bytes()) == ca


def test_a_cluster_node_requires_tls_on_clients_and_verified_tls_on_routes(tmp_path: Path) -> None:
    files = TlsFiles(Path("/c/ca.pem"), Path("/c/node.pem"), Path("/c/node-key.pem"))
    routes = Routes(name="fleet-local", port=6222, peers=(6222, 6223), monitor_port=8222)
    text = NatsServer(store_dir=tmp_path, port=4222, routes=routes, tls=files).config_text()
    client_block, cluster_block = text.split("cluster {")
    assert 'cert_file: "/c/node.pem"' in client_block
    assert "verify: true" not in client_block  # clients show no certificate: their NKey
    assert 'ca_file: "/c/ca.pem"' in cluster_block
    assert "verify: true" in cluster_block
    assert "tls {" not in NatsServer(store_dir=tmp_path, port=4222).config_text()


@pytest.fixture
def tls_server(tmp_path: Path) -> tuple[NatsServer, TlsFiles]:
    files = ensure_tls(tmp_path / "tls")
    return NatsServer(store_dir=tmp_path / "store", sync_interval="2m", tls=files), files


async def test_a_client_trusting_the_ca_connects_over_tls_and_one_trusting_none_is_refused(
    tls_server: tuple[NatsServer, TlsFiles], tmp_path: Path
) -> None:
    server, files = tls_server
    server.start()
    try:
        nc = await connect(server.url, name="test-tls", ca=files.ca)
        try:
            transport = nc._transport  # the one place the socket is visible
            assert transport is not None
            assert transport._io_writer.get_extra_info("ssl_object") is not None  # type: ignore[attr-defined]
            js = nc.jetstream()
            await js.add_stream(name="TLS", subjects=["tls.>"])
            ack = await js.publish("tls.one", b"over tls")
            assert ack.seq == 1
        finally:
            await nc.close()
        with pytest.raises(PermissionRefused, match="the server requires TLS: set FLEET_NATS_CA"):
            await asyncio.wait_for(connect(server.url, name="test-clear"), 20)
        other = ensure_tls(tmp_path / "other")
        with pytest.raises(PermissionRefused, match=f"not one of CA {other.ca}"):
            await asyncio.wait_for(connect(server.url, name="test-other", ca=other.ca), 20)
        # the server's own words: TLS required, before anything else is said
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            info = (await reader.readline()).decode()
            assert '"tls_required":true' in info.replace(" ", "")
        finally:
            writer.close()
            await writer.wait_closed()
    finally:
        server.stop()
