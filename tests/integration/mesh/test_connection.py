"""connect(): a cluster's server list is a list of servers, not one URL with commas in it."""

import pytest

from fleet_mesh.connection import connect
from fleet_mesh.natsserver import NatsServer, free_port


async def test_a_comma_separated_list_reaches_a_live_server_past_a_dead_one(
    nats_server: NatsServer,
) -> None:
    # compose.yaml's NATS_URL form. Read as one URL, it named no server that exists.
    dead = f"nats://127.0.0.1:{free_port()}"
    nc = await connect(f"{dead},{nats_server.url}", name="test-list")
    try:
        assert nc.connected_url is not None
        assert nc.connected_url.port == nats_server.port
        assert len(nc.servers) >= 2
    finally:
        await nc.close()


async def test_the_list_comes_from_nats_url_when_no_url_is_given(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NATS_URL", f"nats://127.0.0.1:{free_port()}, {nats_server.url}")
    nc = await connect(name="test-env-list")
    try:
        assert nc.connected_url is not None
        assert nc.connected_url.port == nats_server.port
    finally:
        await nc.close()


async def test_a_bad_url_is_refused_before_any_connection_attempt() -> None:
    with pytest.raises(ValueError, match="server 1 of 1 is not a NATS server URL"):
        await connect("http://user:pw@127.0.0.1:4222")
