"""Daytona's health where an operator looks: the gateway's `/ready` (from the broker's ping)
and `POST /api/v1/runtime/tests/daytona` (the broker's probe verb), with a broker on the
Daytona contract FAKE and an in-process gateway. A 5xx storm opens the circuit and both say
degraded, then it closes once the cool-down has passed; a 429 with Retry-After is waited out."""

import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client

from fleet_events import bus as verbs
from fleet_events import sandbox as sb
from fleet_events.envelope import new_id
from fleet_harness.daytona_fake import DaytonaFake, fake_in_thread
from fleet_harness.procs import Replica, start_answering
from fleet_harness.waits import eventually
from fleet_mesh import rpc
from fleet_mesh.natsserver import NatsServer

from ..gateway.api_kit import Api, running_api, tenant_id

pytestmark = pytest.mark.slow
COOL_S = 3.0  # the circuit's cool-down here (30 s by default)


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaytonaFake]:
    with fake_in_thread(tmp_path_factory.mktemp("daytona-fake")) as made:
        yield made
    assert made.violations == [], made.violations


@pytest.fixture(scope="module")
def broker(
    fake: DaytonaFake, nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replica]:
    root: Path = tmp_path_factory.mktemp("broker-health")
    replica = start_answering(
        "sandbox-broker",
        nats_server.url,
        root / "broker.log",
        {
            "FLEET_SANDBOX_PROVIDER": "daytona",
            "FLEET_SANDBOX_LOCAL": "false",
            "DAYTONA_API_KEY": "fake-key-never-shown",
            "DAYTONA_API_URL": fake.url,
            "DAYTONA_TARGET": "fake",
            "FLEET_SANDBOX_DAYTONA_SNAPSHOT": "fleet-vm",
            "FLEET_SANDBOX_DAYTONA_CIRCUIT_COOL_S": str(COOL_S),
            "FLEET_SANDBOX_POOL_SIZE": "0",
            "FLEET_SANDBOX_ROOT": str(root / "root"),
            "FLEET_SANDBOX_VOLUMES": str(root / "volumes"),
        },
    )
    yield replica
    replica.stop()


# /ready's per-probe deadline (0.5 s by default). Each check here reads one answer and needs
# the broker's ping in it (Daytona's health rides on it), so a loaded machine's slow pong would
# read as a down broker; no test here has a service that does not answer.
PROBE_S = 5.0


@pytest.fixture
async def api(nats_server: NatsServer, broker: Replica, tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(
        nats_server.url, tmp_path / "gw", services=("sandbox-broker",), probe_timeout_s=PROBE_S
    ) as made:
        yield made


async def ready(api: Api) -> tuple[int, dict[str, Any]]:
    """As an operator reads it: a component's detail is shown to an admin's token only."""
    operator = {"Authorization": f"Bearer {api.token(tenant_id(), 'ops', admin=True)}"}
    response = await api.client.get("/ready", headers=operator)
    return response.status_code, response.json()


def component(body: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in body["components"] if c["name"] == name]
    return dict(found)


async def create(nc: Client, tenant: str) -> sb.SandboxInfo:
    request = sb.CreateSandbox(request_id=new_id(), tenant=tenant)
    info: sb.SandboxInfo = await rpc.call_verb(nc, verbs.CREATE_SANDBOX, request, timeout=60)
    return info


async def delete(nc: Client, tenant: str, sandbox: str) -> None:
    request = sb.DeleteSandbox(request_id=new_id(), tenant=tenant, sandbox=sandbox)
    await rpc.call_verb(nc, verbs.DELETE_SANDBOX, request, target=sandbox, timeout=60)


async def test_ready_and_the_probe_say_daytona_is_up(api: Api, fake: DaytonaFake) -> None:
    status, body = await ready(api)
    assert status == 200, body
    daytona = component(body, "daytona")
    assert (daytona["kind"], daytona["state"], body["degraded"]) == ("provider", "up", [])
    response = await api.call("POST", "/api/v1/runtime/tests/daytona", tenant_id(), json={})
    assert response.status_code == 200, response.text
    probe = response.json()
    assert (probe["kind"], probe["ok"], probe["preflight_ok"], probe["configured"]) == (
        "daytona", True, True, True,
    )  # fmt: skip
    assert [c["name"] for c in probe["checks"]] == [
        "api_key", "api_url", "target", "circuit", "api",
    ]  # fmt: skip
    assert all(c["ok"] for c in probe["checks"])
    assert probe["latency_ms"] is not None
    assert (probe["error"], probe["guidance"], probe["output_preview"]) == ("", [], "")
    assert "fake-key-never-shown" not in response.text
    # asked again at once: the cached answer, and Daytona is not asked again
    listed = fake.count("GET", "/sandbox")
    again = await api.call("POST", "/api/v1/runtime/tests/daytona", tenant_id(), json={})
    assert again.json()["checked_at"] == probe["checked_at"]
    assert fake.count("GET", "/sandbox") == listed


async def test_a_429_with_retry_after_is_waited_out_through_the_broker(
    nc: Client, fake: DaytonaFake, broker: Replica
) -> None:
    tenant = tenant_id()
    asked = fake.count("POST", "/sandbox")
    fake.inject(429, method="POST", route="/sandbox", times=1, retry_after=0.6)
    started = time.monotonic()
    info = await create(nc, tenant)
    waited = time.monotonic() - started
    assert info.provider == "daytona"
    assert fake.count("POST", "/sandbox") == asked + 2  # the 429, then the create
    # its own first backoff is 0.05 s (+ up to 0.1 s jitter): only Retry-After waits this long
    assert waited >= 0.6
    await delete(nc, tenant, info.sandbox)


async def test_a_5xx_storm_opens_the_circuit_ready_says_degraded_then_it_recovers(
    api: Api, nc: Client, fake: DaytonaFake
) -> None:
    tenant = tenant_id()
    fake.inject(503, times=10_000)
    try:
        for _ in range(5):  # five creates, each retried, each ending 503: the circuit opens
            with pytest.raises(rpc.RemoteError) as failed:
                await create(nc, tenant)
            assert failed.value.code == "unavailable"
        status, body = await ready(api)
        assert status == 200, body  # the mesh serves; Daytona's calls fail fast
        daytona = component(body, "daytona")
        assert (daytona["state"], body["degraded"]) == ("degraded", ["daytona"])
        assert "Daytona failed 5 calls in a row" in daytona["detail"]
        operator = {"Authorization": f"Bearer {api.token(tenant, 'root', admin=True)}"}
        response = await api.client.post(  # an admin's: a tenant's names no error (hardening)
            "/api/v1/runtime/tests/daytona", json={}, headers=operator
        )
        probe = response.json()
        assert (probe["ok"], probe["preflight_ok"]) == (False, True)
        checks = {c["name"]: c for c in probe["checks"]}
        assert not checks["circuit"]["ok"]
        assert not checks["api"]["ok"]
        assert "503" in probe["error"]
        assert any("Daytona failed" in g for g in probe["guidance"])
    finally:
        fake.injections.clear()

    async def recovered() -> bool:
        _, now = await ready(api)
        return bool(component(now, "daytona")["state"] == "up")

    await eventually(recovered, timeout=COOL_S + 10, interval=0.2, what="the circuit closing")
    info = await create(nc, tenant)  # the first call after the cool-down closes it for good
    status, body = await ready(api)
    assert (status, body["degraded"]) == (200, [])
    await delete(nc, tenant, info.sandbox)
