"""A real broker process for this directory's tests, and a bus to talk to it."""

import sys
import uuid
from collections.abc import Iterator

import pytest

from fleet_agent.sandbox_bus import SandboxBus
from fleet_events import subjects
from fleet_harness.procs import Replica
from fleet_harness.waits import eventually_sync
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.service import Ping, Pong

BROKER_SECRET = "s3cr3t-broker-only-value"


@pytest.fixture(scope="module")
def broker(nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replica]:
    root = tmp_path_factory.mktemp("sandboxes")
    replica = Replica(
        service="sandbox-broker",
        index=0,
        argv=[sys.executable, "-m", "fleet_sandbox_broker"],
        env={
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "NATS_URL": nats_server.url,
            "FLEET_REPLICA": f"sandbox-broker-{uuid.uuid4().hex[:8]}",
            "FLEET_SANDBOX_ROOT": str(root / "root"),
            "FLEET_SANDBOX_VOLUMES": str(root / "volumes"),
            "FLEET_SANDBOX_ALLOW_LOCAL_REPOS": "true",
            "FLEET_SANDBOX_POOL_SIZE": "2",
            "FLEET_SANDBOX_UID_BASE": "320000",
            "FLEET_SANDBOX_UID_COUNT": "512",
            "FLEET_TEST_SECRET": BROKER_SECRET,
            "PYTHONUNBUFFERED": "1",
        },
        log_path=root / "broker.log",
    ).start()
    with SandboxBus(nats_server.url, tenant="t-probe") as probe:
        probe.run(bootstrap(probe.nc.jetstream()), timeout=30)

        def pong() -> Pong | None:
            try:
                return probe.call(subjects.ping("sandbox-broker"), Ping(), Pong, timeout=0.5)
            except Exception:
                return None

        eventually_sync(pong, timeout=30, what="the sandbox broker to answer ping")
    yield replica
    replica.stop()


@pytest.fixture(scope="module")
def bus(broker: Replica, nats_server: NatsServer) -> Iterator[SandboxBus]:
    with SandboxBus(nats_server.url, tenant="t-sandbox") as connected:
        yield connected
