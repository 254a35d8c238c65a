"""A broker on daytona SIGKILLed: its Daytona sandboxes outlive it, labelled. The restarted
broker (same replica name) reaps the child and takes the session sandbox back, files intact."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet_agent.interpreter import RemoteInterpreter
from fleet_agent.sandbox_bus import SandboxBus
from fleet_events import bus as verbs
from fleet_events import sandbox as sb
from fleet_events import streams
from fleet_events.codec import Codec
from fleet_events.envelope import new_id
from fleet_harness.daytona_fake import DaytonaFake, fake_in_thread
from fleet_harness.procs import start_answering
from fleet_harness.waits import eventually_sync
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.store import EventStore

pytestmark = pytest.mark.slow


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[DaytonaFake]:
    with fake_in_thread(tmp_path / "fake") as made:
        yield made
    assert made.violations == [], made.violations


def stream(bus: SandboxBus, sandbox: str) -> list[Any]:
    async def read() -> list[Any]:
        js = bus.nc.jetstream()
        store = EventStore(js, streams.SANDBOXES, Codec(await JetStreamBlobs.open(js)))
        return [
            s.envelope.data async for s in store.replay(sb.sandbox_subject(bus.tenant, sandbox))
        ]

    return bus.run(read(), timeout=20)


def test_after_a_sigkill_the_child_is_reaped_and_the_session_taken_back(
    fake: DaytonaFake, nats_server: NatsServer, tmp_path: Path
) -> None:
    env = {
        "FLEET_REPLICA": f"dt-{new_id()[:8]}",
        "FLEET_SANDBOX_PROVIDER": "daytona",
        "DAYTONA_API_KEY": "fake-key",
        "DAYTONA_API_URL": fake.url,
        "DAYTONA_TARGET": "fake",
        "FLEET_SANDBOX_DAYTONA_SNAPSHOT": "fleet-vm",
        "FLEET_SANDBOX_POOL_SIZE": "0",
        "FLEET_SANDBOX_ROOT": str(tmp_path / "root"),
        "FLEET_SANDBOX_VOLUMES": str(tmp_path / "v"),
        "FLEET_SANDBOX_UID_LOCKS": str(tmp_path / "uid-locks"),
        "FLEET_SANDBOX_LOCAL": "false",  # Daytona only: no uid pool to sweep
    }
    first = start_answering("sandbox-broker", nats_server.url, tmp_path / "one.log", env)
    second = None
    try:
        with SandboxBus(nats_server.url, tenant=f"t-{new_id()[:10]}") as bus:
            session = bus.call(
                verbs.CREATE_SANDBOX,
                sb.CreateSandbox(
                    request_id=new_id(),
                    tenant=bus.tenant,
                    labels={"session": "s1", "role": "session"},
                ),
                timeout=60,
            )
            repl = RemoteInterpreter(bus, session.sandbox)
            repl.execute("open('notes.txt', 'w').write('kept')")
            request = sb.BuildChild(
                request_id=new_id(),
                tenant=bus.tenant,
                sandbox=session.sandbox,
                context=repl.context,
            )
            child = bus.call(verbs.BUILD_CHILD, request, target=session.sandbox, timeout=60)
            assert child.branch == "fork"
            first.kill()
            second = start_answering("sandbox-broker", nats_server.url, tmp_path / "two.log", env)
            eventually_sync(
                lambda: isinstance(stream(bus, child.sandbox)[-1], sb.SandboxDeleted),
                timeout=30,
                what="the child reaped",
            )

            def live() -> list[str]:
                return [
                    b.dto["labels"]["fleet-rlm/sandbox"]
                    for b in fake.sandboxes.values()
                    if b.dto["state"] != "destroyed"
                ]

            # the reap is recorded first, then the Daytona sandbox is deleted
            eventually_sync(
                lambda: live() == [session.sandbox], timeout=30, what="the child gone on Daytona"
            )
            eventually_sync(
                lambda: bus.sandbox_info(session.sandbox).status == "running",
                timeout=30,
                what="the session sandbox taken back",
            )
            again = RemoteInterpreter(bus, session.sandbox)
            assert again.execute("open('notes.txt').read()") == "kept"
            assert len([b for b in fake.sandboxes.values() if b.dto["state"] != "destroyed"]) == 1
            again.shutdown()
            bus.delete_sandbox(session.sandbox)
    finally:
        first.kill()
        if second is not None:
            second.stop()
