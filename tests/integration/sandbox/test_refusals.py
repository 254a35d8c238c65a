"""What the broker refuses, and how clearly (issue 8, part 1): limits out of bounds, a reused
request id with another body, requests and replies over the payload limit, a tenant over its
quota of live sandboxes, pages of `list`."""

import msgspec
import pytest

from fleet_agent.interpreter import RemoteInterpreter
from fleet_agent.sandbox_bus import SandboxBus
from fleet_events import bus as verbs
from fleet_events import sandbox as sb
from fleet_events.envelope import new_id
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.rpc import RemoteError

from .conftest import TENANT_QUOTA


def listing(bus: SandboxBus, **fields: object) -> sb.SandboxList:
    request = sb.ListSandboxes(request_id=new_id(), tenant=bus.tenant, **fields)  # type: ignore[arg-type]
    return bus.call(verbs.LIST_SANDBOXES, request, timeout=10)


@pytest.mark.parametrize(
    ("field", "value"),
    [("memory_mb", -1), ("cpu_s_total", -1), ("cpu_s_per_cell", 0), ("nproc", 10**6),
     ("wall_s", -1.0), ("open_files", 3), ("file_mb", 0)],
)  # fmt: skip
def test_limits_out_of_bounds_are_refused_naming_field_value_and_range(
    bus: SandboxBus, field: str, value: float
) -> None:
    limits = sb.Limits(**{field: value})  # type: ignore[arg-type]
    before = [item.sandbox for item in listing(bus).items]
    with pytest.raises(RemoteError) as caught:
        bus.create_sandbox(limits=limits)
    assert caught.value.code == "bad_request"
    assert f"limits.{field}={value!r}" in caught.value.message
    assert "allowed" in caught.value.message
    assert [item.sandbox for item in listing(bus).items] == before  # nothing was started


def test_the_same_request_id_with_another_body_is_a_conflict_naming_the_id(
    bus: SandboxBus,
) -> None:
    info = bus.create_sandbox()
    bus.put_file(info.sandbox, "a.txt", b"A")
    bus.put_file(info.sandbox, "b.txt", b"B")
    reused = new_id()
    read_a = sb.GetFile(request_id=reused, tenant=bus.tenant, sandbox=info.sandbox, path="a.txt")
    assert bus.call(verbs.GET_FILE, read_a, target=info.sandbox, timeout=10).data == b"A"
    read_b = sb.GetFile(request_id=reused, tenant=bus.tenant, sandbox=info.sandbox, path="b.txt")
    with pytest.raises(RemoteError) as caught:
        bus.call(verbs.GET_FILE, read_b, target=info.sandbox, timeout=10)
    assert caught.value.code == "conflict"
    assert reused in caught.value.message
    # the genuine retry still gets its original answer
    assert bus.call(verbs.GET_FILE, read_a, target=info.sandbox, timeout=10).data == b"A"
    bus.delete_sandbox(info.sandbox)


def test_a_request_over_one_mib_is_refused_before_the_handler(bus: SandboxBus) -> None:
    info = bus.create_sandbox()
    big = sb.PutFile(
        request_id=new_id(), tenant=bus.tenant, sandbox=info.sandbox, path="big.bin",
        data=b"z" * (1024 * 1024),
    )  # fmt: skip
    with pytest.raises(RemoteError, match="over the 1048576-byte limit") as caught:
        bus.call(verbs.PUT_FILE, big, target=info.sandbox, timeout=10)
    assert caught.value.code == "bad_request"
    repl = RemoteInterpreter(bus, info.sandbox)
    assert repl.execute("import os\nos.path.exists('big.bin')") is False
    repl.shutdown()
    bus.delete_sandbox(info.sandbox)


def test_an_inline_read_too_big_to_send_says_use_via_blob_every_time(bus: SandboxBus) -> None:
    info = bus.create_sandbox()
    repl = RemoteInterpreter(bus, info.sandbox)
    repl.execute("open('seven.bin', 'wb').write(b'q' * (7 * 1024 * 1024))")
    read = sb.GetFile(request_id=new_id(), tenant=bus.tenant, sandbox=info.sandbox,
                      path="seven.bin")  # fmt: skip
    for _ in range(2):  # the retry gets the same clear answer, not a cached failure to send
        with pytest.raises(RemoteError) as caught:
            bus.call(verbs.GET_FILE, read, target=info.sandbox, timeout=30)
        assert caught.value.code == "too_large"
        assert "via_blob" in caught.value.message
    via_blob = sb.GetFile(request_id=new_id(), tenant=bus.tenant, sandbox=info.sandbox,
                          path="seven.bin", via_blob=True)  # fmt: skip
    content = bus.call(verbs.GET_FILE, via_blob, target=info.sandbox, timeout=30)
    assert content.blob is not None
    assert content.size == 7 * 1024 * 1024
    repl.shutdown()
    bus.delete_sandbox(info.sandbox)


def test_execution_output_too_big_to_send_is_truncated_and_says_so(bus: SandboxBus) -> None:
    info = bus.create_sandbox()
    repl = RemoteInterpreter(bus, info.sandbox)
    repl.execute("1")  # opens its context
    # within the runner's own caps (1 MiB of stdout, a 4 MiB frame), over the 1 MiB reply limit
    run = sb.Execute(
        request_id=new_id(), tenant=bus.tenant, sandbox=info.sandbox, context=repl.context,
        code="print('o' * (1024 * 1024))\n'v' * (2 * 1024 * 1024)",
    )  # fmt: skip
    reply = bus.call(verbs.EXECUTE, run, target=info.sandbox, timeout=60)
    assert reply.kind == "result"
    assert reply.truncated
    assert isinstance(reply.value, str)
    assert "reply truncated" in reply.value
    assert reply.value.startswith("vvvv")
    assert len(msgspec.json.encode(reply)) <= 1024 * 1024
    again = bus.call(verbs.EXECUTE, run, target=info.sandbox, timeout=60)
    assert again == reply  # the retry gets the very same (truncated) answer
    assert repl.execute("7") == 7  # the sandbox is fine
    repl.shutdown()
    bus.delete_sandbox(info.sandbox)


def test_list_answers_in_pages_oldest_first(nats_server: NatsServer) -> None:
    with SandboxBus(nats_server.url, tenant=f"t-pages-{new_id()[:8]}") as bus:
        made = [bus.create_sandbox(labels={"n": str(n)}).sandbox for n in range(3)]
        first = listing(bus, limit=2)
        assert [item.sandbox for item in first.items] == made[:2]
        assert first.next_cursor is not None
        rest = listing(bus, limit=2, cursor=first.next_cursor)
        assert [item.sandbox for item in rest.items] == made[2:]
        assert rest.next_cursor is None
        for bad in ({"limit": 0}, {"limit": 100_000}, {"cursor": "not-a-cursor"}):
            with pytest.raises(RemoteError) as caught:
                listing(bus, **bad)
            assert caught.value.code == "bad_request"
        for sandbox in made:
            bus.delete_sandbox(sandbox)
        assert listing(bus).items == []


def test_a_tenant_at_its_quota_of_live_sandboxes_is_refused(nats_server: NatsServer) -> None:
    with SandboxBus(nats_server.url, tenant=f"t-quota-{new_id()[:8]}") as bus:
        held = [bus.create_sandbox(fork_ready=False).sandbox for _ in range(TENANT_QUOTA)]
        with pytest.raises(RemoteError) as caught:
            bus.create_sandbox(fork_ready=False)
        assert caught.value.code == "quota"
        assert f"{TENANT_QUOTA} live sandboxes" in caught.value.message
        with pytest.raises(RemoteError) as forked:
            bus.fork_sandbox(held[0])
        assert forked.value.code == "quota"
        with SandboxBus(nats_server.url, tenant=f"t-other-{new_id()[:8]}") as other:
            other.delete_sandbox(other.create_sandbox().sandbox)  # others are not held up
        bus.delete_sandbox(held.pop())
        held.append(bus.create_sandbox(fork_ready=False).sandbox)  # room again after a delete
        for sandbox in held:
            bus.delete_sandbox(sandbox)
