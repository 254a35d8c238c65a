"""A tenant whose `sandbox_provider` is `daytona` on a broker that has no Daytona: a clear
refusal naming what to set, recorded as `sandbox.create_refused`, and nothing started; the
Daytona probe says "not configured"."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet_agent.sandbox_bus import SandboxBus
from fleet_events import bus as verbs
from fleet_events import sandbox as sb
from fleet_events import streams
from fleet_events.bus import Ping
from fleet_events.codec import Codec
from fleet_events.envelope import new_id
from fleet_harness.procs import Replica, start_answering
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.rpc import RemoteError
from fleet_mesh.runtime_config import RuntimeConfig
from fleet_mesh.store import EventStore

from ..sandbox.provider_kit import uid_block


@pytest.fixture(scope="module")
def local_only(
    nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replica]:
    root: Path = tmp_path_factory.mktemp("broker-local-only")
    replica = start_answering(
        "sandbox-broker",
        nats_server.url,
        root / "broker.log",
        {
            "FLEET_SANDBOX_POOL_SIZE": "0",
            "FLEET_SANDBOX_ROOT": str(root / "root"),
            "FLEET_SANDBOX_VOLUMES": str(root / "volumes"),
            "FLEET_SANDBOX_UID_BASE": str(uid_block(361000)),
            "FLEET_SANDBOX_UID_COUNT": "16",
        },
    )
    yield replica
    replica.stop()


@pytest.fixture
def tenant(local_only: Replica, nats_server: NatsServer) -> Iterator[SandboxBus]:
    with SandboxBus(nats_server.url, tenant=f"t-{new_id()[:10]}") as bus:
        yield bus


def stored(bus: SandboxBus) -> list[Any]:
    async def read() -> list[Any]:
        js = bus.nc.jetstream()
        store = EventStore(js, streams.SANDBOXES, Codec(await JetStreamBlobs.open(js)))
        return [s.envelope.data async for s in store.replay(sb.tenant_filter(bus.tenant))]

    return bus.run(read(), timeout=20)


def test_a_tenant_set_to_daytona_without_daytona_is_refused_naming_what_to_set(
    tenant: SandboxBus,
) -> None:
    async def put() -> None:
        config = await RuntimeConfig.open(tenant.nc.jetstream())
        await config.set("sandbox_provider", "daytona", tenant=tenant.tenant)

    tenant.run(put(), timeout=10)
    held = tenant.call(verbs.ping("sandbox-broker"), Ping(), timeout=5).details["sandboxes"]
    with pytest.raises(RemoteError) as refused:
        tenant.create_sandbox(labels={"session": "s1"})
    assert refused.value.code == "provider_not_configured"
    for needed in ("sandbox_provider='daytona'", "DAYTONA_API_KEY", "DAYTONA_API_URL",
                   "DAYTONA_TARGET", "local"):  # fmt: skip
        assert needed in refused.value.message
    (event,) = stored(tenant)
    assert isinstance(event, sb.CreateRefused)
    assert (event.provider, event.labels) == ("daytona", {"session": "s1"})
    assert "DAYTONA_API_KEY" in event.reason
    after = tenant.call(verbs.ping("sandbox-broker"), Ping(), timeout=5).details
    assert after["sandboxes"] == held  # nothing was started
    assert after["providers"] == ["local"]
    assert "daytona" not in after


def test_the_daytona_probe_says_not_configured(tenant: SandboxBus) -> None:
    ask = sb.TestDaytona(request_id=new_id(), tenant=tenant.tenant)
    probe = tenant.call(verbs.TEST_DAYTONA, ask, timeout=10)
    assert (probe.ok, probe.preflight_ok, probe.configured) == (False, False, False)
    assert probe.error == "not configured"
    assert "DAYTONA_API_KEY" in probe.guidance[0]
