"""A real broker process for this directory's tests, and a bus to talk to it."""

from collections.abc import Iterator

import pytest

from fleet_agent.sandbox_bus import SandboxBus
from fleet_harness.procs import Replica, start_answering
from fleet_mesh.natsserver import NatsServer

BROKER_SECRET = "s3cr3t-broker-only-value"
TENANT_QUOTA = 6  # live sandboxes per tenant (test_refusals.py fills one tenant to it)


@pytest.fixture(scope="module")
def broker(nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replica]:
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
        },
    )
    yield replica
    replica.stop()


@pytest.fixture(scope="module")
def bus(broker: Replica, nats_server: NatsServer) -> Iterator[SandboxBus]:
    with SandboxBus(nats_server.url, tenant="t-sandbox") as connected:
        yield connected
