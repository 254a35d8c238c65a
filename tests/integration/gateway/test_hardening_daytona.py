"""The Daytona probe (`POST /api/v1/runtime/tests/daytona`) through a real sandbox broker
process on the Daytona contract FAKE: an admin sees the deployment's Daytona host, target and
broker replica and the failed call's error; any other tenant gets the same verdict (each
check's name and pass/fail, the latency) with none of them in the answer."""

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from tests.integration.gateway.api_kit import Api, running_api, tenant_id

from fleet_harness.daytona_fake import DaytonaFake, fake_in_thread
from fleet_harness.procs import Replica, start_answering
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.connection import connect
from fleet_mesh.natsserver import NatsServer

pytestmark = pytest.mark.slow
PROBE = "/api/v1/runtime/tests/daytona"
TARGET = "eu-operator-7q"  # distinctive: found in an answer only if it leaked


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    root = tmp_path_factory.mktemp("probe-nats")
    running = NatsServer(
        store_dir=root / "store", sync_interval="2m", log_path=root / "nats.log"
    ).start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaytonaFake]:
    with fake_in_thread(tmp_path_factory.mktemp("daytona-fake")) as made:
        yield made
    assert made.violations == [], made.violations


@pytest.fixture(scope="module")
def broker(
    fake: DaytonaFake, server: NatsServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replica]:
    root: Path = tmp_path_factory.mktemp("broker-probe")
    replica = start_answering(
        "sandbox-broker", server.url, root / "broker.log",
        {
            "FLEET_SANDBOX_PROVIDER": "daytona", "FLEET_SANDBOX_LOCAL": "false",
            "DAYTONA_API_KEY": "fake-key-never-shown", "DAYTONA_API_URL": fake.url,
            "DAYTONA_TARGET": TARGET, "FLEET_SANDBOX_DAYTONA_SNAPSHOT": "fleet-vm",
            "FLEET_SANDBOX_POOL_SIZE": "0", "FLEET_SANDBOX_ROOT": str(root / "root"),
            "FLEET_SANDBOX_VOLUMES": str(root / "volumes"),
        },
    )  # fmt: skip
    yield replica
    replica.stop()


@pytest.fixture
async def api(server: NatsServer, broker: Replica, tmp_path: Path) -> AsyncIterator[Api]:
    nc = await connect(server.url, name="probe-test")
    await bootstrap(nc.jetstream())
    await nc.close()
    async with running_api(server.url, tmp_path / "gw", services=("sandbox-broker",)) as made:
        yield made


async def test_only_an_admin_sees_the_deployments_daytona_host_target_replica_and_error(
    api: Api, fake: DaytonaFake
) -> None:
    tenant = tenant_id()
    fake.inject(503, method="GET", route="/sandbox", times=10_000)  # the live call fails
    try:
        admin = await api.client.post(
            PROBE,
            json={},
            headers={"Authorization": f"Bearer {api.token(tenant, 'root', admin=True)}"},
        )
        assert admin.status_code == 200, admin.text
        full = admin.json()
        host = str(urlsplit(fake.url).hostname)
        port = str(urlsplit(fake.url).port)
        details = {c["name"]: c["detail"] for c in full["checks"]}
        # what a leak would show: the admin's answer carries every one of them
        assert host in details["api_url"]
        assert port in details["api_url"]
        assert details["target"] == TARGET
        assert full["replica"]
        assert full["error"]
        assert (full["ok"], full["preflight_ok"], full["redacted"]) == (False, True, False)

        seen = await api.call("POST", PROBE, tenant, json={})
        assert seen.status_code == 200, seen.text
        mine = seen.json()
        # the same verdict (the broker's cached probe)...
        assert mine["checked_at"] == full["checked_at"]
        assert (mine["ok"], mine["preflight_ok"], mine["configured"]) == (False, True, True)
        assert [(c["name"], c["ok"]) for c in mine["checks"]] == [
            (c["name"], c["ok"]) for c in full["checks"]
        ]
        assert mine["latency_ms"] == full["latency_ms"]
        assert mine["guidance"]
        assert mine["redacted"] is True
        # ...naming nothing of the deployment
        for leaked in (f"{host}:{port}", TARGET, full["replica"], full["error"], "fake-key"):
            assert leaked not in seen.text, leaked
        assert all(c["detail"] == "" for c in mine["checks"])
        assert mine["replica"] == ""
    finally:
        fake.injections.clear()
