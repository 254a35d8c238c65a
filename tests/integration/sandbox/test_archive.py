"""Archive on each provider (`provider_bus`), as its capability says: a Daytona sandbox is
archived by Daytona (files kept in its cold storage, nothing running) and no longer served; a
local one cannot be, which is a declined request recorded as `sandbox.archive_refused`, the
sandbox running on."""

from typing import Any

import pytest
from nats.errors import NoRespondersError

from fleet_agent.interpreter import RemoteInterpreter
from fleet_agent.sandbox_bus import SandboxBus
from fleet_events import bus as verbs
from fleet_events import sandbox as sb
from fleet_events import streams
from fleet_events.codec import Codec
from fleet_events.envelope import new_id
from fleet_harness.daytona_fake import DaytonaFake
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.rpc import RemoteError
from fleet_mesh.store import EventStore


def events(bus: SandboxBus, sandbox: str) -> list[Any]:
    async def read() -> list[Any]:
        js = bus.nc.jetstream()
        store = EventStore(js, streams.SANDBOXES, Codec(await JetStreamBlobs.open(js)))
        return [
            s.envelope.data async for s in store.replay(sb.sandbox_subject(bus.tenant, sandbox))
        ]

    return bus.run(read(), timeout=20)


def test_archive_does_what_the_provider_declares(
    provider_bus: SandboxBus, daytona_fake: DaytonaFake
) -> None:
    bus = provider_bus
    info = bus.create_sandbox(labels={"session": "s1", "role": "session"})
    assert info.capabilities is not None
    RemoteInterpreter(bus, info.sandbox).execute("open('kept.txt', 'w').write('x')")
    ask = sb.ArchiveSandbox(
        request_id=new_id(), tenant=bus.tenant, sandbox=info.sandbox, reason="end of day"
    )
    if info.capabilities.archive:
        assert info.provider == "daytona"
        archived = bus.call(verbs.ARCHIVE_SANDBOX, ask, target=info.sandbox, timeout=60)
        assert (archived.status, archived.stopped_reason) == ("stopped", "archived")
        (remote,) = [
            b for b in daytona_fake.sandboxes.values()
            if b.dto["labels"].get("fleet-rlm/sandbox") == info.sandbox
        ]  # fmt: skip
        assert remote.dto["state"] == "archived"
        with pytest.raises(NoRespondersError):  # no replica serves it any more
            bus.sandbox_info(info.sandbox)
        assert isinstance(events(bus, info.sandbox)[-1], sb.SandboxArchived)
    else:
        assert info.provider == "local"
        with pytest.raises(RemoteError) as declined:
            bus.call(verbs.ARCHIVE_SANDBOX, ask, target=info.sandbox, timeout=60)
        assert declined.value.code == "declined"
        assert "cannot archive" in declined.value.message
        refused = events(bus, info.sandbox)[-1]
        assert isinstance(refused, sb.ArchiveRefused)
        assert bus.read_file(info.sandbox, "kept.txt") == b"x"  # running on, untouched
        bus.delete_sandbox(info.sandbox)
