"""A real broker process for this directory's tests, and a bus to talk to it.

The broker has both providers: `local`, and `daytona` pointed at the Daytona contract FAKE
(`fleet_harness.daytona_fake`, on a loop thread of this process). Which one a tenant's sandboxes
run on is its `sandbox_provider` setting in the config KV, so `provider_bus` (a tenant of its
own on each provider in turn) runs one test body against both; `bus` and every tenant that sets
nothing stays on `local`, the broker's default.
"""

from collections.abc import Iterator

import pytest

from fleet_agent.sandbox_bus import SandboxBus
from fleet_events.envelope import new_id
from fleet_harness.daytona_fake import DaytonaFake, fake_in_thread
from fleet_harness.procs import Replica, start_answering
from fleet_mesh.natsserver import NatsServer

from .provider_kit import PROVIDERS, set_provider

BROKER_SECRET = "s3cr3t-broker-only-value"
TENANT_QUOTA = 6  # live sandboxes per tenant (test_refusals.py fills one tenant to it)


@pytest.fixture(scope="module")
def daytona_fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaytonaFake]:
    with fake_in_thread(tmp_path_factory.mktemp("daytona-fake")) as made:
        yield made
    assert made.violations == [], made.violations


@pytest.fixture(scope="module")
def broker(
    nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory, daytona_fake: DaytonaFake
) -> Iterator[Replica]:
    root = tmp_path_factory.mktemp("sandboxes")
    replica = start_answering(
        "sandbox-broker",
        nats_server.url,
        root / "broker.log",
        {
            "FLEET_SANDBOX_ROOT": str(root / "root"),
            "FLEET_SANDBOX_VOLUMES": str(root / "volumes"),
            "FLEET_SANDBOX_ALLOW_LOCAL_REPOS": "true",
            "FLEET_SANDBOX_POOL_SIZE": "2",
            "FLEET_SANDBOX_UID_BASE": "320000",
            "FLEET_SANDBOX_UID_COUNT": "512",
            "FLEET_TEST_SECRET": BROKER_SECRET,
            "FLEET_SANDBOX_TENANT_QUOTA": str(TENANT_QUOTA),
            "DAYTONA_API_KEY": "fake-key",
            "DAYTONA_API_URL": daytona_fake.url,
            "DAYTONA_TARGET": "fake",
            "FLEET_SANDBOX_DAYTONA_SNAPSHOT": "fleet-vm",
        },
    )
    yield replica
    replica.stop()


@pytest.fixture(scope="module")
def bus(broker: Replica, nats_server: NatsServer) -> Iterator[SandboxBus]:
    with SandboxBus(nats_server.url, tenant="t-sandbox") as connected:
        yield connected


@pytest.fixture(params=PROVIDERS)
def provider_bus(
    request: pytest.FixtureRequest, nats_server: NatsServer, broker: Replica
) -> Iterator[SandboxBus]:
    """A tenant of its own whose `sandbox_provider` is each provider in turn."""
    provider: str = request.param
    with SandboxBus(nats_server.url, tenant=f"t-{provider[:1]}{new_id()[:10]}") as bus:
        set_provider(bus, provider)
        yield bus
