"""The broker's bus API: idempotent requests, files, tenancy, listing and lifecycle events."""

import pytest
from nats.errors import NoRespondersError

from fleet_agent.interpreter import RemoteInterpreter
from fleet_agent.sandbox_bus import SandboxBus
from fleet_events import bus as verbs
from fleet_events import sandbox as sb
from fleet_events import streams
from fleet_events.codec import Codec
from fleet_events.envelope import BlobRef, new_id
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.rpc import RemoteError
from fleet_mesh.store import EventStore


def event_types(bus: SandboxBus, sandbox: str) -> list[str]:
    async def read() -> list[str]:
        js = bus.nc.jetstream()
        store = EventStore(js, streams.SANDBOXES, Codec(await JetStreamBlobs.open(js)))
        subject = sb.sandbox_subject(bus.tenant, sandbox)
        found = []
        async for stored in store.replay(subject):
            tag = type(stored.envelope.data).__struct_config__.tag
            found.append(str(tag))
        return found

    return bus.run(read(), timeout=20)


def test_a_retried_request_gets_the_original_answer(provider_bus: SandboxBus) -> None:
    bus = provider_bus  # on each provider: REPL state persists, a retry never runs twice
    create = sb.CreateSandbox(request_id=new_id(), tenant=bus.tenant)
    first = bus.call(verbs.CREATE_SANDBOX, create, timeout=30)
    again = bus.call(verbs.CREATE_SANDBOX, create, timeout=30)
    assert again.sandbox == first.sandbox
    repl = RemoteInterpreter(bus, first.sandbox)
    repl.execute("count = 0")
    run = sb.Execute(
        request_id=new_id(), tenant=bus.tenant, sandbox=first.sandbox, context=repl.context,
        code="count += 1\ncount",
    )  # fmt: skip
    answers = [
        bus.call(verbs.EXECUTE, run, target=first.sandbox, timeout=30).value for _ in range(3)
    ]
    assert answers == [1, 1, 1]
    assert repl.execute("count") == 1
    repl.shutdown()
    bus.delete_sandbox(first.sandbox)


def test_files_in_and_out_inline_and_through_the_object_store(provider_bus: SandboxBus) -> None:
    bus = provider_bus
    info = bus.create_sandbox()
    bus.put_file(info.sandbox, "in/data.csv", b"a,b\n1,2\n")

    async def upload(data: bytes) -> BlobRef:
        return await (await JetStreamBlobs.open(bus.nc.jetstream())).put(bus.tenant, data)

    big = b"x" * (3 * 1024 * 1024)
    ref = bus.run(upload(big), timeout=30)
    put = sb.PutFile(
        request_id=new_id(), tenant=bus.tenant, sandbox=info.sandbox, path="big.bin", blob=ref
    )
    stored = bus.call(verbs.PUT_FILE, put, target=info.sandbox, timeout=30)
    assert stored.sha256 == ref.sha256
    repl = RemoteInterpreter(bus, info.sandbox)
    assert repl.execute("open('in/data.csv').read().splitlines()[1]") == "1,2"
    assert repl.execute("len(open('big.bin', 'rb').read())") == len(big)
    repl.execute("open('out.txt', 'w').write('result')")
    assert bus.read_file(info.sandbox, "out.txt") == b"result"
    get = sb.GetFile(
        request_id=new_id(), tenant=bus.tenant, sandbox=info.sandbox, path="big.bin", via_blob=True
    )
    content = bus.call(verbs.GET_FILE, get, target=info.sandbox, timeout=30)
    assert content.blob is not None
    assert content.blob.sha256 == ref.sha256
    repl.shutdown()
    bus.delete_sandbox(info.sandbox)


def test_paths_outside_the_workspace_links_and_oversize_reads_are_refused(bus: SandboxBus) -> None:
    info = bus.create_sandbox()
    repl = RemoteInterpreter(bus, info.sandbox)
    repl.execute("import os\nos.symlink('/etc/shadow', 'shadow')\nos.symlink('/etc', 'etc')")
    repl.execute("open('large.txt', 'w').write('y' * 5000)")
    for path in ("../runner.py", "/etc/passwd", "a/../../x", "shadow", "etc/passwd"):
        with pytest.raises(RemoteError) as caught:
            bus.read_file(info.sandbox, path)
        assert caught.value.code == "path_refused", path
    with pytest.raises(RemoteError) as caught:
        bus.put_file(info.sandbox, "etc/evil", b"x")
    assert caught.value.code == "path_refused"
    read = sb.GetFile(
        request_id=new_id(), tenant=bus.tenant, sandbox=info.sandbox, path="large.txt",
        max_bytes=1000,
    )  # fmt: skip
    with pytest.raises(RemoteError, match="5000 bytes, over the 1000-byte read limit") as caught:
        bus.call(verbs.GET_FILE, read, target=info.sandbox, timeout=10)
    assert caught.value.code == "too_large"
    repl.shutdown()
    bus.delete_sandbox(info.sandbox)


def test_a_tenant_cannot_see_or_use_another_tenants_sandbox(
    bus: SandboxBus, nats_server: NatsServer
) -> None:
    info = bus.create_sandbox(labels={"session": "mine"})
    with SandboxBus(nats_server.url, tenant="t-intruder") as intruder:
        with pytest.raises(RemoteError) as caught:
            intruder.sandbox_info(info.sandbox)
        assert caught.value.code == "not_found"
        with pytest.raises(RemoteError):
            intruder.read_file(info.sandbox, "x")
        listed = intruder.call(
            verbs.LIST_SANDBOXES,
            sb.ListSandboxes(request_id=new_id(), tenant="t-intruder"),
            timeout=10,
        )
        assert info.sandbox not in [item.sandbox for item in listed.items]
    mine = bus.call(
        verbs.LIST_SANDBOXES,
        sb.ListSandboxes(request_id=new_id(), tenant=bus.tenant, session="mine"),
        timeout=10,
    )
    assert [item.sandbox for item in mine.items] == [info.sandbox]
    bus.delete_sandbox(info.sandbox)


def test_invalid_ids_are_refused_at_the_edge(bus: SandboxBus) -> None:
    bad = sb.CreateSandbox(request_id=new_id(), tenant="a.b")
    with pytest.raises(RemoteError, match="invalid tenant id") as caught:
        bus.call(verbs.CREATE_SANDBOX, bad, timeout=10)
    assert caught.value.code == "bad_request"


def test_lifecycle_events_land_on_the_sandbox_stream(bus: SandboxBus) -> None:
    info = bus.create_sandbox(limits=sb.Limits(wall_s=1))
    repl = RemoteInterpreter(bus, info.sandbox)
    repl.execute("x = 1")
    child = bus.fork_sandbox(info.sandbox)
    bus.delete_sandbox(child.sandbox)
    repl.shutdown()
    loop = RemoteInterpreter(bus, info.sandbox)
    with pytest.raises(Exception, match="wall-time"):
        loop.execute("while True:\n    pass")
    bus.delete_sandbox(info.sandbox)
    assert event_types(bus, info.sandbox) == [
        "sandbox.created",
        "sandbox.context_opened",
        "sandbox.context_closed",
        "sandbox.context_opened",
        "sandbox.limit_exceeded",
        "sandbox.deleted",
    ]
    assert event_types(bus, child.sandbox) == ["sandbox.forked", "sandbox.deleted"]
    with pytest.raises(NoRespondersError):  # nobody holds a deleted sandbox any more
        bus.sandbox_info(info.sandbox)


def test_a_request_id_learnt_from_another_tenant_never_returns_their_answer(
    bus: SandboxBus, nats_server: NatsServer
) -> None:
    info = bus.create_sandbox()
    bus.put_file(info.sandbox, "notes.txt", b"ALICE-PRIVATE-DATA")
    shared_id = new_id()
    read = sb.GetFile(
        request_id=shared_id, tenant=bus.tenant, sandbox=info.sandbox, path="notes.txt"
    )
    assert bus.call(verbs.GET_FILE, read, target=info.sandbox, timeout=10).data == (
        b"ALICE-PRIVATE-DATA"
    )
    with SandboxBus(nats_server.url, tenant="t-bob") as bob:
        listed = bob.call(
            verbs.LIST_SANDBOXES, sb.ListSandboxes(request_id=shared_id, tenant="t-bob"), timeout=10
        )
        assert listed.items == []
        with pytest.raises(RemoteError) as caught:
            bob.call(
                verbs.GET_FILE,
                sb.GetFile(
                    request_id=shared_id, tenant="t-bob", sandbox=info.sandbox, path="notes.txt"
                ),
                target=info.sandbox,
                timeout=10,
            )
        assert caught.value.code == "not_found"
    bus.delete_sandbox(info.sandbox)
