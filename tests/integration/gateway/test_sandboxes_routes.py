"""`/api/v1/sandboxes` against a real broker process and real sandboxes: the tenant's own
sandboxes listed, read and deleted; another tenant's is 404 on every route and survives its
delete; ids that would address other NATS subjects are refused before any request."""

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.js import JetStreamContext

from fleet_events import bus, new_id
from fleet_events.bus import Ping
from fleet_events.sandbox import CreateSandbox, GetSandbox
from fleet_harness.procs import Launcher
from fleet_harness.waits import eventually
from fleet_mesh import rpc
from fleet_mesh.natsserver import NatsServer

from .api_kit import Api, running_api, tenant_id

pytestmark = pytest.mark.slow


@pytest.fixture
async def api(nats_server: NatsServer, js: JetStreamContext, tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(nats_server.url, tmp_path / "gw") as running:
        yield running


@pytest.fixture
async def broker(nc: Client, launcher: Launcher, tmp_path: Path) -> None:
    launcher.start("sandbox-broker", env={
        "FLEET_SANDBOX_ROOT": str(tmp_path / "sandboxes"),
        "FLEET_SANDBOX_VOLUMES": str(tmp_path / "volumes"),
    })  # fmt: skip

    async def up() -> bool:
        try:
            await rpc.call_verb(nc, bus.ping("sandbox-broker"), Ping(), timeout=0.5)
        except Exception:  # no responders while it starts
            return False
        return True

    await eventually(up, timeout=60, what="the broker to answer ping")


async def _create(nc: Client, tenant: str, session: str) -> str:
    info = await rpc.call_verb(
        nc, bus.CREATE_SANDBOX,
        CreateSandbox(request_id=new_id(), tenant=tenant, labels={"session": session}),
        timeout=60,
    )  # fmt: skip
    return info.sandbox


async def _held(nc: Client, tenant: str, sandbox: str) -> bool:
    ask = GetSandbox(request_id=new_id(), tenant=tenant, sandbox=sandbox)
    try:
        await rpc.call_verb(nc, bus.GET_SANDBOX, ask, target=sandbox, timeout=10)
    except (NoRespondersError, rpc.RemoteError):
        return False
    return True


async def test_a_tenant_lists_reads_and_deletes_only_its_own_sandboxes(
    api: Api, nc: Client, broker: None
) -> None:
    mine, other = tenant_id(), tenant_id()
    session = new_id()
    box = await _create(nc, mine, session)
    theirs = await _create(nc, other, new_id())

    listed = await api.call("GET", "/api/v1/sandboxes", mine)
    assert listed.status_code == 200, listed.text
    ids = [item["sandbox"] for item in listed.json()["items"]]
    assert box in ids
    assert theirs not in ids
    by_session = await api.call("GET", "/api/v1/sandboxes", mine, params={"session": "nope"})
    assert box not in [i["sandbox"] for i in by_session.json()["items"]]

    got = await api.call("GET", f"/api/v1/sandboxes/{box}", mine)
    assert got.status_code == 200, got.text
    body = got.json()
    assert (body["sandbox"], body["status"], body["labels"]) == (
        box,
        "running",
        {"session": session},
    )
    assert body["capabilities"] is not None
    for host_detail in ("workspace", "pid", "uid", "tenant"):
        assert host_detail not in body

    for method in ("GET", "DELETE"):
        foreign = await api.call(method, f"/api/v1/sandboxes/{theirs}", mine)
        assert foreign.status_code == 404, (method, foreign.text)
        assert foreign.json()["code"] == "sandbox_not_found"
        assert theirs in foreign.json()["message"]
    assert await _held(nc, other, theirs), "another tenant's delete stopped the sandbox"

    deleted = await api.call("DELETE", f"/api/v1/sandboxes/{box}", mine)
    assert deleted.status_code == 200, deleted.text
    assert deleted.json() == {"sandbox": box, "deleted": True}
    assert not await _held(nc, mine, box)
    gone = await api.call("GET", f"/api/v1/sandboxes/{box}", mine)
    assert gone.status_code == 404, gone.text


async def test_ids_that_would_address_other_subjects_are_refused(api: Api, nc: Client) -> None:
    tenant = tenant_id()
    seen: list[str] = []

    async def spy(msg: object) -> None:
        seen.append(getattr(msg, "subject", ""))

    sub = await nc.subscribe("fleet.rpc.sandbox-broker.sandbox.>", cb=spy)
    try:
        for hostile in ("*", ">", "a.b", "x.info.y", "%2A"):
            for method in ("GET", "DELETE"):
                response = await api.call(method, f"/api/v1/sandboxes/{hostile}", tenant)
                assert response.status_code == 422, (hostile, method, response.text)
                assert response.json()["code"] == "invalid_sandbox_id"
        await nc.flush()
    finally:
        await sub.unsubscribe()
    assert seen == [], f"hostile ids reached the bus: {seen}"


async def test_without_a_broker_the_list_is_503(tmp_path: Path) -> None:
    from fleet_mesh.bootstrap import bootstrap
    from fleet_mesh.connection import connect

    # a server of its own: on the shared one another test's broker may be answering
    server = NatsServer(store_dir=tmp_path / "store", log_path=tmp_path / "nats.log").start()
    try:
        nc = await connect(server.url, name="test")
        await bootstrap(nc.jetstream())
        await nc.close()
        async with running_api(server.url, tmp_path / "gw") as api:
            response = await api.call("GET", "/api/v1/sandboxes", tenant_id())
            assert response.status_code == 503, response.text
            assert response.json()["code"] == "broker_unavailable"
    finally:
        server.stop()
