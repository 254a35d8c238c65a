"""`/ready` answers anyone the verdict, and only an admin the deployment's detail.

A probe has no token, so `/ready` stays unauthenticated; but its full report names the NATS
server's address and version, every service's replica and each failure's text. Here a real
nats-server, the other services' pings answered by the test (as `test_ready.py` does), and a
gateway with a data dir, so gateway tokens and API tokens can be minted.
"""

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from tests.integration.gateway.api_kit import Api, running_api, tenant_id

from fleet_events import bus as verbs
from fleet_events.bus import Ping, Pong
from fleet_mesh import rpc
from fleet_mesh.natsserver import NatsServer

ANSWERING = ("agent", "sandbox-broker", "budget")  # quality is left down: a failure's text
REPLICA = "gateway-ready-detail"


@pytest.fixture
async def api(
    nats_server: NatsServer, nc: Client, js: JetStreamContext, tmp_path: Path
) -> AsyncIterator[Api]:
    served = []
    for service in ANSWERING:

        async def pong(_: Ping, service: str = service) -> Pong:
            return Pong(service=service, replica=f"{service}-replica-7", pid=0, uptime_s=0.0)

        served.append(await rpc.serve_verb(nc, verbs.ping(service), pong))
    await nc.flush()  # the gateway asks on a connection of its own: the server must know these
    try:
        # a wide deadline: quality's "down" is decided at once (no responders), so it only
        # bounds how long a live fake on a loaded machine may take to answer
        async with running_api(
            nats_server.url, tmp_path, replica=REPLICA, probe_timeout_s=5.0
        ) as made:
            yield made
    finally:
        for one in served:
            await one.stop()


def _leaks(text: str, nats_server: NatsServer) -> list[str]:
    """What in a body says how the deployment is laid out."""
    marks = ["nats://", "127.0.0.1", str(nats_server.port), REPLICA, "replica-7", "server 2."]
    marks.append("no replica running")
    return [mark for mark in marks if mark in text]


def _states(body: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["state"] for c in body["components"]}


async def _ready(api: Api, token: str | None = None) -> httpx.Response:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return await api.client.get("/ready", headers=headers)


async def test_an_anonymous_ready_says_the_verdict_and_each_state_and_nothing_else(
    api: Api, nats_server: NatsServer
) -> None:
    response = await _ready(api)
    assert response.status_code == 503  # quality is down: the verdict is still told
    body = response.json()
    assert _leaks(response.text, nats_server) == [], body
    assert body["ready"] is False
    states = _states(body)
    assert states["quality"] == "down"
    assert (states["nats"], states["agent"], states["gateway"]) == ("up", "up", "up")
    assert set(body["components"][0]) == {"name", "kind", "state"}
    assert "shown to an admin only" in body["withheld"]
    assert "Authorization: Bearer" in body["withheld"]


async def test_an_admin_gateway_token_gets_the_full_report(
    api: Api, nats_server: NatsServer
) -> None:
    response = await _ready(api, api.token(tenant_id(), "ops", admin=True))
    assert response.status_code == 503
    body = response.json()
    components = {c["name"]: c for c in body["components"]}
    assert f"127.0.0.1:{nats_server.port}" in components["nats"]["detail"]
    assert components["gateway"]["replica"] == REPLICA
    assert components["agent"]["replica"] == "agent-replica-7"
    assert components["quality"]["detail"] == "no replica running"
    assert "withheld" not in body


async def test_an_admin_api_token_gets_the_full_report(api: Api, nats_server: NatsServer) -> None:
    tenant = tenant_id()
    issued = await api.client.post(
        "/api/v1/auth/tokens",
        json={"name": "probe", "ttl_s": 600, "admin": True},
        headers={"Authorization": f"Bearer {api.token(tenant, 'ops', admin=True)}"},
    )
    assert issued.status_code == 201, issued.text
    response = await _ready(api, issued.json()["token"])
    components = {c["name"]: c for c in response.json()["components"]}
    assert components["budget"]["replica"] == "budget-replica-7"


async def test_a_tenants_token_that_is_not_an_admins_gets_the_verdict_only(
    api: Api, nats_server: NatsServer
) -> None:
    response = await _ready(api, api.token(tenant_id(), "bob"))
    assert response.status_code == 503
    assert _leaks(response.text, nats_server) == []
    assert "'bob' is not an admin" in response.json()["withheld"]


async def test_a_refused_token_still_gets_the_verdict_and_is_told_why(
    api: Api, nats_server: NatsServer
) -> None:
    """A probe's answer does not depend on a token: a forged one is no 401 here, and no
    detail either."""
    forged = api.token(tenant_id(), "ops", admin=True)[:-4] + "AAAA"
    response = await _ready(api, forged)
    assert response.status_code == 503
    assert _leaks(response.text, nats_server) == []
    assert _states(response.json())["agent"] == "up"
    assert "your token was not accepted (invalid_token;" in response.json()["withheld"]
