"""`resume` of a Daytona session sandbox whose broker died, answered by another broker (another
replica name, another host): the sandbox lives on Daytona, so it is taken back in place (same
id, files kept, REPL memory lost) rather than replaced, as a local one on another host must be.
A tenant on daytona asking a broker without Daytona is refused before anything is claimed."""

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
from fleet_harness.procs import Replica, start_answering
from fleet_harness.waits import eventually_sync
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.rpc import RemoteError

from ..sandbox.provider_kit import set_provider

pytestmark = pytest.mark.slow


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[DaytonaFake]:
    with fake_in_thread(tmp_path / "fake") as made:
        yield made
    assert made.violations == [], made.violations


def start(nats: NatsServer, root: Path, replica: str, fake: DaytonaFake | None) -> Replica:
    env = {
        "FLEET_REPLICA": replica,
        "FLEET_SANDBOX_LOCAL": "false" if fake is not None else "true",
        "FLEET_SANDBOX_PROVIDER": "daytona" if fake is not None else "local",
        "FLEET_SANDBOX_POOL_SIZE": "0",
        "FLEET_SANDBOX_ROOT": str(root / replica),
        "FLEET_SANDBOX_VOLUMES": str(root / "volumes"),
        "FLEET_SANDBOX_UID_BASE": "362000",
        "FLEET_SANDBOX_UID_COUNT": "16",
    }
    if fake is not None:
        env |= {
            "DAYTONA_API_KEY": "fake-key", "DAYTONA_API_URL": fake.url,
            "DAYTONA_TARGET": "fake", "FLEET_SANDBOX_DAYTONA_SNAPSHOT": "fleet-vm",
        }  # fmt: skip
    return start_answering("sandbox-broker", nats.url, root / f"{replica}.log", env)


def answering(bus: SandboxBus, replica: str) -> None:
    def answered() -> bool:
        try:
            return bus.call(verbs.ping("sandbox-broker"), Ping(), timeout=0.3).replica == replica
        except Exception:
            return False

    eventually_sync(answered, timeout=30, what=f"{replica} to answer")


def test_a_vanished_daytona_session_sandbox_is_taken_back_in_place_by_another_broker(
    fake: DaytonaFake, nats_server: NatsServer, tmp_path: Path
) -> None:
    first = start(nats_server, tmp_path, f"dt-a-{new_id()[:6]}", fake)
    second: Replica | None = None
    try:
        with SandboxBus(nats_server.url, tenant=f"t-{new_id()[:10]}") as bus:
            set_provider(bus, "daytona")
            answering(bus, first.env["FLEET_REPLICA"])
            ask = sb.CreateSandbox(
                request_id=new_id(), tenant=bus.tenant, labels={"session": "s1", "role": "session"}
            )
            session = bus.call(verbs.CREATE_SANDBOX, ask, timeout=60)
            assert session.replica == first.env["FLEET_REPLICA"]
            repl = RemoteInterpreter(bus, session.sandbox)
            repl.execute("open('notes.txt', 'w').write('kept')\nmemory = 1")
            first.kill()
            second = start(nats_server, tmp_path, f"dt-b-{new_id()[:6]}", fake)
            answering(bus, second.env["FLEET_REPLICA"])
            resume = sb.ResumeSandbox(
                request_id=new_id(), tenant=bus.tenant, sandbox=session.sandbox
            )
            back = bus.call(verbs.RESUME_SANDBOX, resume, timeout=60)
            assert (back.sandbox, back.replica) == (session.sandbox, second.env["FLEET_REPLICA"])
            again = RemoteInterpreter(bus, session.sandbox)
            assert again.execute("open('notes.txt').read()") == "kept"
            assert again.execute("'memory' in globals()") is False
            live = [b for b in fake.sandboxes.values() if b.dto["state"] != "destroyed"]
            assert len(live) == 1  # the same Daytona sandbox, not a replacement
            again.shutdown()
            bus.delete_sandbox(session.sandbox)
    finally:
        first.kill()
        if second is not None:
            second.stop()


def test_resume_on_a_broker_without_the_tenants_provider_claims_nothing(
    fake: DaytonaFake, nats_server: NatsServer, tmp_path: Path
) -> None:
    first = start(nats_server, tmp_path, f"dt-c-{new_id()[:6]}", fake)
    second: Replica | None = None
    try:
        with SandboxBus(nats_server.url, tenant=f"t-{new_id()[:10]}") as bus:
            set_provider(bus, "daytona")
            answering(bus, first.env["FLEET_REPLICA"])
            session = bus.create_sandbox(labels={"session": "s1", "role": "session"})
            first.kill()
            second = start(nats_server, tmp_path, f"dt-d-{new_id()[:6]}", None)  # no Daytona
            answering(bus, second.env["FLEET_REPLICA"])
            resume = sb.ResumeSandbox(
                request_id=new_id(), tenant=bus.tenant, sandbox=session.sandbox
            )
            with pytest.raises(RemoteError) as refused:
                bus.call(verbs.RESUME_SANDBOX, resume, timeout=60)
            assert refused.value.code == "provider_not_configured"
            listed = bus.call(
                verbs.LIST_SANDBOXES, sb.ListSandboxes(request_id=new_id(), tenant=bus.tenant),
                timeout=10,
            )  # fmt: skip
            # still live in the log: a broker with Daytona can take it back later
            assert [(i.sandbox, i.status) for i in listed.items] == [(session.sandbox, "running")]
    finally:
        first.kill()
        if second is not None:
            second.stop()
