"""`/health` and `/ready` of the gateway app, mounted in-process against a real nats-server.

The other services' pings are answered by the test itself (the same `Pong` a service gives), so
each case controls exactly which component is up; `tests/e2e` covers the real processes. The
client sends an admin's token, as the details asserted here are shown to an admin only
(`test_ready_detail.py` is what anyone else sees).
"""

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import httpx
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from fleet_events import bus as verbs
from fleet_events import streams, subjects
from fleet_events.bus import Ping, Pong
from fleet_gateway.app import create_app
from fleet_gateway.config import GatewaySettings
from fleet_harness.waits import eventually
from fleet_mesh import rpc
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.connection import connect
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.tokens import issue_token, signing_secret

OTHERS = ("agent", "sandbox-broker", "budget", "quality")
Gateway = Callable[..., AbstractAsyncContextManager[httpx.AsyncClient]]


@pytest.fixture
def gateway(tmp_path: Path) -> Gateway:
    @asynccontextmanager
    async def mounted(
        nats_url: str, probe_timeout_s: float = 5.0
    ) -> AsyncIterator[httpx.AsyncClient]:
        # A wide deadline: every "down" here is decided at once (no responders, NATS gone),
        # so it only bounds how long a live but slow replica on a loaded machine may take.
        settings = GatewaySettings(probe_timeout_s=probe_timeout_s, data_dir=tmp_path)
        app = create_app(settings, replica="gateway-test", nats_url=nats_url)
        admin = issue_token(signing_secret(tmp_path), tenant="ops", user="ops", admin=True)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(
                transport=transport, base_url="http://gateway",
                headers={"Authorization": f"Bearer {admin}"},
            ) as client:  # fmt: skip
                yield client

    return mounted


async def _answer_pings(nc: Client, services: tuple[str, ...]) -> list[rpc.Served]:
    subs = []
    for service in services:

        async def pong(_: Ping, service: str = service) -> Pong:
            return Pong(service=service, replica=f"{service}-fake", pid=0, uptime_s=0.0)

        subs.append(await rpc.serve_verb(nc, verbs.ping(service), pong))
    await nc.flush()  # the gateway asks on a connection of its own: the server must know these
    return subs


def _by_name(body: dict[str, object]) -> dict[str, dict[str, object]]:
    components = body["components"]
    assert isinstance(components, list)
    return {c["name"]: c for c in components}


async def test_health_answers_while_the_process_is_alive(
    gateway: Gateway, nats_server: NatsServer
) -> None:
    async with gateway(nats_server.url) as client:
        response = await client.get("/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "service": "gateway", "replica": "gateway-test"}


async def test_ready_is_200_when_nats_every_store_and_every_service_are_up(
    gateway: Gateway, nats_server: NatsServer, nc: Client, js: JetStreamContext
) -> None:
    subs = await _answer_pings(nc, OTHERS)
    try:
        async with gateway(nats_server.url) as client:
            response = await client.get("/ready")
    finally:
        for sub in subs:
            await sub.stop()
    body = response.json()
    assert response.status_code == 200, body
    assert body["ready"] is True
    components = _by_name(body)
    expected = {"nats", *(s.name for s in streams.STREAMS), *subjects.SERVICES}
    expected |= {kv.bucket for kv in streams.KV_BUCKETS}
    expected |= {obj.bucket for obj in streams.OBJECT_STORES}
    assert set(components) == expected
    assert all(c["state"] == "up" for c in components.values())
    assert "server 2.15.1" in str(components["nats"]["detail"])
    assert components["gateway"]["replica"] == "gateway-test"
    assert components["budget"]["replica"] == "budget-fake"
    assert isinstance(components["agent"]["latency_ms"], float)


async def test_ready_is_503_and_names_the_service_that_is_down(
    gateway: Gateway, nats_server: NatsServer, nc: Client, js: JetStreamContext
) -> None:
    subs = await _answer_pings(nc, ("agent", "sandbox-broker", "budget"))
    try:
        async with gateway(nats_server.url) as client:
            response = await client.get("/ready")
    finally:
        for sub in subs:
            await sub.stop()
    body = response.json()
    assert response.status_code == 503
    assert body["ready"] is False
    components = _by_name(body)
    assert components["quality"]["state"] == "down"
    assert components["quality"]["detail"] == "no replica running"
    assert [name for name, c in components.items() if c["state"] == "down"] == ["quality"]


async def test_ready_reports_missing_stores_before_the_bootstrap_and_up_after(
    gateway: Gateway, private_nats: NatsServer
) -> None:
    async with gateway(private_nats.url) as client:
        before = _by_name((await client.get("/ready")).json())
        nc = await connect(private_nats.url, name="test-bootstrap")
        try:
            await bootstrap(nc.jetstream())
        finally:
            await nc.close()
        after = _by_name((await client.get("/ready")).json())
    assert before["SESSIONS"]["state"] == "down"
    assert before["SESSIONS"]["detail"] == "missing: run the bootstrap"
    assert before["fleet-config"]["state"] == "down"
    assert before["nats"]["state"] == "up"
    assert all(after[name]["state"] == "up" for name in ("SESSIONS", "WORK", "fleet-blobs"))


async def test_ready_reports_nats_down_when_the_server_is_gone(
    gateway: Gateway, private_nats: NatsServer
) -> None:
    async with gateway(private_nats.url) as client:
        private_nats.kill()

        async def nats_down() -> httpx.Response | None:
            response = await client.get("/ready")
            return response if _by_name(response.json())["nats"]["state"] == "down" else None

        response = await eventually(nats_down, timeout=10, what="/ready to see NATS gone")
        assert (await client.get("/health")).status_code == 200
    assert response.status_code == 503
    assert _by_name(response.json())["agent"]["detail"] == "nats down"


async def test_ready_asks_every_service_before_waiting_on_any_answer(
    gateway: Gateway, nc: Client, nats_server: NatsServer, js: JetStreamContext
) -> None:
    """Three slow services cost one probe deadline, not three, only if the probes are in flight
    together. Each of these replicas answers only once all three have been asked: probes sent
    one after another would leave the first waiting on an answer that needs the second's ping,
    and every one would be reported down. No clock is read."""
    slow = ("agent", "sandbox-broker", "budget")
    asked: set[str] = set()
    all_asked = asyncio.Event()

    def answering_once_all_are_asked(service: str) -> Callable[[Ping], Awaitable[Pong]]:
        async def pong(_: Ping) -> Pong:
            asked.add(service)
            if asked >= set(slow):
                all_asked.set()
            await all_asked.wait()
            return Pong(service=service, replica=f"{service}-slow", pid=0, uptime_s=0.0)

        return pong

    served = [
        await rpc.serve_verb(nc, verbs.ping(s), answering_once_all_are_asked(s)) for s in slow
    ]
    served += await _answer_pings(nc, ("quality",))
    try:
        async with gateway(nats_server.url, probe_timeout_s=10.0) as client:
            response = await client.get("/ready")
    finally:
        all_asked.set()  # release any handler still waiting, so the subscriptions stop cleanly
        for one in served:
            await one.stop()
    components = _by_name(response.json())
    assert response.status_code == 200, components
    assert {components[s]["replica"] for s in slow} == {f"{s}-slow" for s in slow}
    assert asked == set(slow)
