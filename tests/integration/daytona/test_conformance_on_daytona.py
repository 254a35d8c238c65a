"""The interpreter conformance suite (tests/integration/interpreter/test_conformance.py, the
same functions, not a copy) against a broker on daytona over the contract fake.

A test that did not hold on this provider would be named in NOT_YET with its reason and not
collected (never skipped); none is now.
"""

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_agent.sandbox_bus import SandboxBus
from fleet_harness.daytona_fake import DaytonaFake, fake_in_thread
from fleet_harness.procs import Replica, start_answering
from fleet_mesh.natsserver import NatsServer

NOT_YET: dict[str, str] = {}  # every test of the suite holds on daytona (on the fake)

_path = Path(__file__).parents[1] / "interpreter" / "test_conformance.py"
_spec = importlib.util.spec_from_file_location("fleet_conformance_suite", _path)
assert _spec is not None
assert _spec.loader is not None
_suite = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_suite)
globals().update(
    {
        name: value
        for name, value in vars(_suite).items()
        if (name.startswith("test_") and name not in NOT_YET) or name in ("interp", "sandbox")
    }
)

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
    root = tmp_path_factory.mktemp("broker-daytona")
    replica = start_answering(
        "sandbox-broker",
        nats_server.url,
        root / "broker.log",
        {
            "FLEET_SANDBOX_PROVIDER": "daytona",
            "DAYTONA_API_KEY": "fake-key",
            "DAYTONA_API_URL": fake.url,
            "DAYTONA_TARGET": "fake",
            "FLEET_SANDBOX_DAYTONA_SNAPSHOT": "fleet-vm",
            "FLEET_SANDBOX_POOL_SIZE": "0",
            "FLEET_SANDBOX_ROOT": str(root / "root"),
            "FLEET_SANDBOX_UID_LOCKS": str(root / "uid-locks"),
            "FLEET_SANDBOX_LOCAL": "false",  # Daytona only: no uid pool to sweep
        },
    )
    yield replica
    replica.stop()


@pytest.fixture(scope="module")
def bus(broker: Replica, nats_server: NatsServer) -> Iterator[SandboxBus]:
    with SandboxBus(nats_server.url, tenant="t-interp-daytona") as connected:
        yield connected
