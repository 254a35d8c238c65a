"""A broker process with both providers, driven over NATS exactly as the agent drives the local
one: a tenant whose `sandbox_provider` setting is `daytona` gets Daytona sandboxes (on the
contract FAKE), and nothing above the broker knows which provider ran the code."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_agent.interpreter import RemoteInterpreter
from fleet_agent.sandbox_bus import SandboxBus
from fleet_events import bus as verbs
from fleet_events import sandbox as sb
from fleet_events.bus import Ping
from fleet_events.envelope import new_id
from fleet_harness.daytona_fake import DaytonaFake, fake_in_thread
from fleet_harness.procs import start_answering
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.rpc import RemoteError
from fleet_mesh.runtime_config import RuntimeConfig

from ..sandbox.provider_kit import uid_block

pytestmark = pytest.mark.slow


def set_provider(bus: SandboxBus, provider: str) -> None:
    async def put() -> None:
        config = await RuntimeConfig.open(bus.nc.jetstream())
        await config.set("sandbox_provider", provider, tenant=bus.tenant)

    bus.run(put(), timeout=10)


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaytonaFake]:
    with fake_in_thread(tmp_path_factory.mktemp("daytona-fake")) as made:
        yield made
    assert made.violations == [], made.violations


@pytest.fixture(scope="module")
def bus(
    fake: DaytonaFake, nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SandboxBus]:
    root: Path = tmp_path_factory.mktemp("broker-daytona")
    replica = start_answering(
        "sandbox-broker",
        nats_server.url,
        root / "broker.log",
        {
            "DAYTONA_API_KEY": "fake-key",
            "DAYTONA_API_URL": fake.url,
            "DAYTONA_TARGET": "fake",
            "FLEET_SANDBOX_DAYTONA_SNAPSHOT": "fleet-vm",
            "FLEET_SANDBOX_POOL_SIZE": "0",
            "FLEET_SANDBOX_ROOT": str(root / "root"),
            "FLEET_SANDBOX_VOLUMES": str(root / "volumes"),
            # the local provider too (the default): a uid block of its own, host-wide locks
            "FLEET_SANDBOX_UID_BASE": str(uid_block(360000)),
            "FLEET_SANDBOX_UID_COUNT": "64",
        },
    )
    try:
        with SandboxBus(nats_server.url, tenant=f"t-daytona-{new_id()[:8]}") as connected:
            set_provider(connected, "daytona")
            yield connected
    finally:
        replica.stop()


def test_each_tenant_gets_the_provider_its_setting_names(
    bus: SandboxBus, nats_server: NatsServer, fake: DaytonaFake
) -> None:
    on_daytona = bus.create_sandbox()
    assert on_daytona.provider == "daytona"
    assert on_daytona.capabilities is not None
    assert on_daytona.capabilities.archive
    made = len(fake.sandboxes)
    with SandboxBus(nats_server.url, tenant=f"t-local-{new_id()[:8]}") as other:
        on_local = other.create_sandbox()  # nothing set: the broker's default, local
        assert on_local.provider == "local"
        assert RemoteInterpreter(other, on_local.sandbox).execute("6 * 7") == 42
        assert len(fake.sandboxes) == made  # Daytona was not asked
        set_provider(other, "daytona")  # a change applies to the next create, no restart
        moved = other.create_sandbox()
        assert moved.provider == "daytona"
        assert other.sandbox_info(on_local.sandbox).provider == "local"  # held where it runs
        other.delete_sandbox(moved.sandbox)
        other.delete_sandbox(on_local.sandbox)
    bus.delete_sandbox(on_daytona.sandbox)


def test_a_sandbox_on_daytona_through_the_bus(bus: SandboxBus, fake: DaytonaFake) -> None:
    info = bus.create_sandbox()
    assert info.provider == "daytona"
    bus.put_file(info.sandbox, "in/data.csv", b"a,b\n1,2\n")
    repl = RemoteInterpreter(bus, info.sandbox)
    assert repl.execute("open('in/data.csv').read().splitlines()[1]") == "1,2"
    repl.execute("kept = 6 * 7")
    assert repl.execute("kept") == 42
    repl.execute("open('out.txt', 'w').write('result')")
    assert bus.read_file(info.sandbox, "out.txt") == b"result"
    repl.shutdown()
    bus.delete_sandbox(info.sandbox)
    assert all(box.dto["state"] == "destroyed" for box in fake.sandboxes.values())


def build_child(bus: SandboxBus, parent: str, context: str) -> sb.ChildSandbox:
    request = sb.BuildChild(
        request_id=new_id(), tenant=bus.tenant, sandbox=parent, context=context, labels={}
    )
    return bus.call(verbs.BUILD_CHILD, request, target=parent, timeout=60)


def test_a_child_is_a_daytona_fork_with_the_files_and_not_the_repl_memory(
    bus: SandboxBus, fake: DaytonaFake
) -> None:
    parent = bus.create_sandbox()
    repl = RemoteInterpreter(bus, parent.sandbox)
    repl.execute("found = 'parent state'\nopen('notes.txt', 'w').write('parent file')")
    child = build_child(bus, parent.sandbox, repl.context)
    assert child.branch == "fork"
    child_repl = RemoteInterpreter(bus, child.sandbox, context=child.context)
    assert child_repl.execute("open('notes.txt').read()") == "parent file"
    with pytest.raises(Exception, match="NameError"):
        child_repl.execute("found")
    child_repl.shutdown()
    bus.delete_sandbox(child.sandbox)
    repl.shutdown()
    bus.delete_sandbox(parent.sandbox)


def test_a_422_on_fork_gives_a_clean_child_through_the_policy(
    bus: SandboxBus, fake: DaytonaFake
) -> None:
    parent = bus.create_sandbox()
    repl = RemoteInterpreter(bus, parent.sandbox)
    repl.execute("x = 1")
    fake.inject(422, method="POST", route="/sandbox/{sandboxIdOrName}/fork")
    child = build_child(bus, parent.sandbox, repl.context)
    assert child.branch == "clean_fallback"
    assert "linux-vm" in child.reason
    child_repl = RemoteInterpreter(bus, child.sandbox, context=child.context)
    assert child_repl.execute("6 * 7") == 42
    child_repl.shutdown()
    bus.delete_sandbox(child.sandbox)
    repl.shutdown()
    bus.delete_sandbox(parent.sandbox)


def test_a_5xx_storm_opens_the_circuit_and_the_ping_says_daytona_is_degraded(
    bus: SandboxBus, fake: DaytonaFake
) -> None:
    before = bus.call(verbs.ping("sandbox-broker"), Ping(), timeout=5).details["daytona"]
    assert before["ok"] is True
    fake.inject(503, times=10_000)
    try:
        refusals = []
        for _ in range(5):  # five creates, each retried, each ending 503: the circuit opens
            with pytest.raises(RemoteError) as failed:
                bus.create_sandbox()
            refusals.append(failed.value)
        after = bus.call(verbs.ping("sandbox-broker"), Ping(), timeout=5).details["daytona"]
        assert after["ok"] is False
        assert after["checks"]["circuit"] == "open"
        assert "Daytona failed 5 calls in a row" in after["guidance"]
        asked = len(fake.calls)
        with pytest.raises(RemoteError, match="degraded"):
            bus.create_sandbox()
        assert len(fake.calls) == asked  # failed fast: Daytona was not asked
        assert {r.code for r in refusals} == {"unavailable"}
        assert all("503" in r.message for r in refusals)
    finally:
        fake.injections.clear()
