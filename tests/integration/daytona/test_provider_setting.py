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
from fleet_harness.waits import eventually_sync
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.rpc import RemoteError
from fleet_mesh.store import EventStore

from ..sandbox.provider_kit import set_provider, uid_block

RECORD_S = 1.0  # a refusal is recorded at most once per this, per tenant (60 s by default)


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
            "FLEET_SANDBOX_REFUSAL_RECORD_S": str(RECORD_S),
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
    set_provider(tenant, "daytona")
    held = tenant.call(verbs.ping("sandbox-broker"), Ping(), timeout=5).details["sandboxes"]
    with pytest.raises(RemoteError) as refused:
        tenant.create_sandbox(labels={"session": "s1"})
    assert refused.value.code == "provider_not_configured"
    for needed in ("sandbox_provider='daytona' (the tenant's setting)", "DAYTONA_API_KEY",
                   "DAYTONA_API_URL", "DAYTONA_TARGET", "local"):  # fmt: skip
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


def test_refusals_are_all_answered_and_recorded_at_most_once_per_interval(
    tenant: SandboxBus,
) -> None:
    """A tenant that keeps asking cannot grow the log without bound: every create is refused,
    one is recorded per interval, and the next record counts those in between."""
    set_provider(tenant, "daytona")
    for _ in range(3):
        with pytest.raises(RemoteError, match="DAYTONA_API_KEY"):
            tenant.create_sandbox()
    (first,) = stored(tenant)
    assert first.unrecorded == 0
    asked = [3]

    def recorded_again() -> list[Any] | None:
        with pytest.raises(RemoteError, match="DAYTONA_API_KEY"):
            tenant.create_sandbox()
        asked[0] += 1
        found = stored(tenant)
        return found if len(found) == 2 else None

    _, second = eventually_sync(recorded_again, timeout=RECORD_S + 10, interval=0.1,
                                what="a refusal recorded once the interval passed")  # fmt: skip
    assert isinstance(second, sb.CreateRefused)
    assert second.unrecorded == asked[0] - 2  # all but the two recorded
    assert second.unrecorded >= 2
