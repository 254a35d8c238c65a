"""`POST /api/v1/sandboxes/{id}/archive` through a real broker process holding both providers:
a Daytona sandbox (on the contract FAKE) is archived by its provider and no longer served,
and the log says so; a local one cannot be archived, which is a 409 that names what to do and
a `sandbox.archive_refused` on the log, the sandbox running on; another tenant's is 404."""

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from tests.integration.gateway.api_kit import Api, running_api, tenant_id
from tests.integration.sandbox.provider_kit import uid_block

from fleet_events import bus, new_id, streams
from fleet_events import sandbox as sb
from fleet_events.bus import Ping
from fleet_events.codec import Codec
from fleet_harness.daytona_fake import DaytonaFake, fake_in_thread
from fleet_harness.procs import Replica, start_answering
from fleet_mesh import rpc
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.store import EventStore

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaytonaFake]:
    with fake_in_thread(tmp_path_factory.mktemp("daytona-fake")) as made:
        yield made
    assert made.violations == [], made.violations


@pytest.fixture(scope="module")
def broker(
    fake: DaytonaFake, nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replica]:
    root: Path = tmp_path_factory.mktemp("broker-archive")
    replica = start_answering(
        "sandbox-broker", nats_server.url, root / "broker.log",
        {
            "DAYTONA_API_KEY": "fake-key", "DAYTONA_API_URL": fake.url,
            "DAYTONA_TARGET": "fake", "FLEET_SANDBOX_DAYTONA_SNAPSHOT": "fleet-vm",
            "FLEET_SANDBOX_POOL_SIZE": "0", "FLEET_SANDBOX_ROOT": str(root / "root"),
            "FLEET_SANDBOX_VOLUMES": str(root / "volumes"),
            "FLEET_SANDBOX_UID_BASE": str(uid_block(380000)), "FLEET_SANDBOX_UID_COUNT": "64",
        },
    )  # fmt: skip
    yield replica
    replica.stop()


@pytest.fixture
async def api(
    nats_server: NatsServer, js: JetStreamContext, broker: Replica, tmp_path: Path
) -> AsyncIterator[Api]:
    async with running_api(nats_server.url, tmp_path / "gw") as running:
        yield running


async def _create(nc: Client, tenant: str) -> sb.SandboxInfo:
    ask = sb.CreateSandbox(request_id=new_id(), tenant=tenant, labels={"session": "s"})
    info: sb.SandboxInfo = await rpc.call_verb(nc, bus.CREATE_SANDBOX, ask, timeout=60)
    return info


async def _events(js: JetStreamContext, tenant: str, sandbox: str) -> list[Any]:
    store = EventStore(js, streams.SANDBOXES, Codec(await JetStreamBlobs.open(js)))
    return [s.envelope.data async for s in store.replay(sb.sandbox_subject(tenant, sandbox))]


async def test_a_daytona_sandbox_is_archived_and_no_longer_served(
    api: Api, nc: Client, js: JetStreamContext, fake: DaytonaFake
) -> None:
    mine, other = tenant_id(), tenant_id()
    await rpc.call_verb(nc, bus.ping("sandbox-broker"), Ping(), timeout=5)
    admin = {"Authorization": f"Bearer {api.token(mine, 'root', admin=True)}"}
    chosen = await api.client.patch(  # the provider is an admin's choice for the tenant
        f"/api/v1/runtime/settings/tenants/{mine}",
        json={"updates": {"sandbox_provider": "daytona"}}, headers=admin,
    )  # fmt: skip
    assert chosen.status_code == 200, chosen.text
    made = await _create(nc, mine)
    assert made.provider == "daytona"

    foreign = await api.call("POST", f"/api/v1/sandboxes/{made.sandbox}/archive", other)
    assert (foreign.status_code, foreign.json()["code"]) == (404, "sandbox_not_found")
    archived = await api.call("POST", f"/api/v1/sandboxes/{made.sandbox}/archive", mine)
    assert archived.status_code == 200, archived.text
    assert (archived.json()["status"], archived.json()["stopped_reason"]) == (
        "stopped", "archived",
    )  # fmt: skip
    remote = [box for box in fake.sandboxes.values() if box.dto["state"] == "archived"]
    assert len(remote) == 1, "the provider was not asked to archive"
    events = await _events(js, mine, made.sandbox)
    assert isinstance(events[-1], sb.SandboxArchived)
    assert events[-1].provider == "daytona"
    gone = await api.call("GET", f"/api/v1/sandboxes/{made.sandbox}", mine)
    assert gone.status_code == 404, "an archived sandbox is still served"
    listed = await api.call("GET", "/api/v1/sandboxes", mine)
    (row,) = [s for s in listed.json()["items"] if s["sandbox"] == made.sandbox]
    assert (row["status"], row["stopped_reason"]) == ("stopped", "archived: " + events[-1].reason)


async def test_a_local_sandbox_cannot_be_archived_and_the_refusal_is_recorded(
    api: Api, nc: Client, js: JetStreamContext
) -> None:
    mine = tenant_id()
    made = await _create(nc, mine)
    assert made.provider == "local"
    refused = await api.call("POST", f"/api/v1/sandboxes/{made.sandbox}/archive", mine)
    assert (refused.status_code, refused.json()["code"]) == (409, "archive_refused")
    assert "cannot archive" in refused.json()["message"]
    assert "delete it instead" in refused.json()["message"]
    events = await _events(js, mine, made.sandbox)
    assert isinstance(events[-1], sb.ArchiveRefused)
    still = await api.call("GET", f"/api/v1/sandboxes/{made.sandbox}", mine)
    assert (still.status_code, still.json()["status"]) == (200, "running")
    bad = await api.call("POST", "/api/v1/sandboxes/a.b/archive", mine)
    assert (bad.status_code, bad.json()["code"]) == (422, "invalid_sandbox_id")
