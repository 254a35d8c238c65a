"""The `daytona` provider through the real SDK against the contract fake."""

import hashlib
import json
import time
from pathlib import Path

import pytest
from daytona import DaytonaConflictError

from fleet_events.sandbox import ExecuteReply, Limits, ToolCall, ToolReply
from fleet_harness.daytona_fake import DaytonaFake
from fleet_sandbox_broker.errors import Conflict, ForkFailed, SandboxNotFound, Unavailable
from fleet_sandbox_broker.providers.base import ToolRelay
from fleet_sandbox_broker.providers.daytona.provider import (
    HELPER_NAME,
    LABEL,
    DaytonaProvider,
    DaytonaSandbox,
)

from .conftest import settings

LIMITS = Limits(wall_s=20)


async def _no_tools(call: ToolCall) -> ToolReply:
    return ToolReply(ok=False, error="no tools here")


async def run(
    box: DaytonaSandbox, code: str, context: str = "main", **variables: object
) -> ExecuteReply:
    blobs: dict[str, str] = {}
    digests: dict[str, str] = {}
    for name, value in variables.items():
        text = json.dumps(value)
        digest = hashlib.sha256(text.encode()).hexdigest()
        blobs[digest] = text
        digests[name] = digest
    return await box.execute(
        context=context,
        code=code,
        variables=digests,
        blobs=blobs,
        tools=[],
        output_fields=None,
        wall_s=20,
        relay=_no_tools,
    )


async def test_capabilities_say_a_fork_copies_files_not_repl_memory(
    daytona: DaytonaProvider,
) -> None:
    assert daytona.capabilities.fork is True
    assert daytona.capabilities.fork_keeps_repl_memory is False
    assert daytona.capabilities.archive is True


async def test_repl_state_persists_in_a_context_and_the_answer_is_not_read_from_stdout(
    daytona: DaytonaProvider,
) -> None:
    box = await daytona.create("sb-1", LIMITS)
    assert (await run(box, "x = 41")).kind == "result"
    reply = await run(box, 'print(\'{"kind": "final", "value": 666}\')\nSUBMIT(answer=x + 1)')
    assert reply.kind == "final"
    assert reply.value == {"answer": 42}
    assert '"value": 666' in reply.stdout  # printed text stays output, never the answer
    failed = await run(box, "1/0")
    assert failed.kind == "error"
    assert "ZeroDivisionError" in failed.error
    assert (await run(box, "SUBMIT(v)", v="hello")).value == {"output": "hello"}
    await box.destroy()


async def test_files_travel_as_bytes_both_ways(daytona: DaytonaProvider) -> None:
    box = await daytona.create("sb-files", LIMITS)
    payload = bytes(range(256)) * 4
    await box.write_file("data/blob.bin", payload)
    assert await box.read_file("data/blob.bin", 1 << 20) == payload
    reply = await run(box, "SUBMIT(len(open('data/blob.bin', 'rb').read()))")
    assert reply.value == {"output": len(payload)}
    await box.destroy()


async def test_every_sandbox_is_labelled_with_its_id_replica_and_parent(
    daytona: DaytonaProvider, fake: DaytonaFake
) -> None:
    parent = await daytona.create("sb-p", LIMITS)
    child = await daytona.fork(parent, "sb-c")
    labels = {
        box.dto["labels"][f"{LABEL}/sandbox"]: box.dto["labels"] for box in fake.sandboxes.values()
    }
    assert labels["sb-p"][f"{LABEL}/replica"] == "r1"
    assert labels["sb-c"][f"{LABEL}/parent"] == "sb-p"
    found = await daytona.find(parent="sb-p")
    assert [s.labels[f"{LABEL}/sandbox"] for s in found] == ["sb-c"]
    await child.destroy()
    await parent.destroy()


async def test_a_fork_copies_files_but_not_repl_memory(daytona: DaytonaProvider) -> None:
    parent = await daytona.create("sb-fp", LIMITS)
    await parent.write_file("notes.txt", b"from the parent")
    await run(parent, "y = 7")
    child = await daytona.fork(parent, "sb-fc")
    assert await child.read_file("notes.txt", 1024) == b"from the parent"
    missing = await run(child, "SUBMIT(y)")
    assert missing.kind == "error"
    assert "NameError" in missing.error
    await child.write_file("notes.txt", b"child")
    assert await parent.read_file("notes.txt", 1024) == b"from the parent"
    await child.destroy()
    await parent.destroy()


async def test_fork_of_a_container_sandbox_is_a_fork_failure_with_advice(fake: DaytonaFake) -> None:
    provider = DaytonaProvider(settings(fake, snapshot="plain-container", vm=False))
    try:
        assert provider.capabilities.fork is False
        box = await provider.create("sb-ct", LIMITS)
        with pytest.raises(ForkFailed, match="linux-vm"):
            await provider.fork(box, "sb-ct-child")
        await box.destroy()
    finally:
        await provider.close()


async def test_a_parent_is_deleted_after_its_children(
    daytona: DaytonaProvider, fake: DaytonaFake
) -> None:
    parent = await daytona.create("sb-tree", LIMITS)
    child = await daytona.fork(parent, "sb-tree-1")
    await daytona.fork(child, "sb-tree-2")
    # the service itself refuses a parent with live forks: the provider must order the deletes
    with pytest.raises(DaytonaConflictError, match="live fork"):
        await parent.remote.delete()
    await parent.destroy()
    assert [b for b in fake.sandboxes.values() if b.dto["state"] != "destroyed"] == []


async def test_a_deleted_sandbox_is_not_found_with_advice(daytona: DaytonaProvider) -> None:
    box = await daytona.create("sb-gone", LIMITS)
    await box.remote.delete()
    with pytest.raises(SandboxNotFound, match="create a new sandbox"):
        await box.read_file("x", 10)


async def test_a_volume_is_mounted_at_its_subpath_once_ready(
    daytona: DaytonaProvider, fake: DaytonaFake
) -> None:
    fake.volume_ready_after = 3  # polled while pending_create, mounted only when ready
    one = await daytona.create("sb-v1", LIMITS, mounts={"data": Path("shared/tenant-a")})
    await one.write_file("data/kept.txt", b"durable")
    two = await daytona.create("sb-v2", LIMITS, mounts={"data": Path("shared/tenant-a")})
    assert await two.read_file("data/kept.txt", 100) == b"durable"
    other = await daytona.create("sb-v3", LIMITS, mounts={"data": Path("shared/tenant-b")})
    with pytest.raises(SandboxNotFound):
        await other.read_file("data/kept.txt", 100)
    assert fake.count("GET", "/volumes/by-name/{name}") >= 3
    for box in (one, two, other):
        await box.destroy()


async def test_archive(daytona: DaytonaProvider, fake: DaytonaFake) -> None:
    box = await daytona.create("sb-arch", LIMITS)
    await box.archive()
    assert fake.sandboxes[box.remote.id].dto["state"] == "archived"


async def test_a_429_with_retry_after_is_waited_out(
    daytona: DaytonaProvider, fake: DaytonaFake
) -> None:
    fake.inject(429, method="POST", route="/sandbox", times=2, retry_after=0.3)
    started = time.monotonic()
    box = await daytona.create("sb-429", LIMITS)
    waited = time.monotonic() - started
    assert fake.count("POST", "/sandbox") == 3
    # the backoff of its own would be 0.05 s then 0.1 s: only Retry-After makes it wait 2 x 0.3 s
    assert waited >= 0.6
    await box.destroy()


async def test_a_5xx_storm_opens_the_circuit_and_reports_degraded(fake: DaytonaFake) -> None:
    provider = DaytonaProvider(settings(fake, attempts=2, circuit_threshold=3))
    try:
        fake.inject(503, times=1000)
        for _ in range(3):
            with pytest.raises(Unavailable, match="503"):
                await provider.create("sb-storm", LIMITS)
        health = provider.circuit.health()
        assert health["ok"] is False
        assert "Daytona failed 3 calls" in str(health["guidance"])
        calls = len(fake.calls)
        with pytest.raises(Unavailable, match="degraded"):
            await provider.create("sb-storm", LIMITS)
        assert len(fake.calls) == calls  # failed fast: Daytona was not asked again
    finally:
        fake.injections.clear()
        await provider.close()


async def test_a_409_is_a_conflict_with_advice(daytona: DaytonaProvider, fake: DaytonaFake) -> None:
    box = await daytona.create("sb-409", LIMITS)
    fake.inject(409, method="POST", route="/files/bulk-upload")
    with pytest.raises(Conflict, match="current state"):
        await box.write_file("a.txt", b"x")
    await box.destroy()


async def test_sandbox_code_sees_none_of_the_brokers_environment(
    daytona: DaytonaProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_TEST_SECRET", "broker-only")
    box = await daytona.create("sb-env", LIMITS)
    reply = await run(box, "import os\nSUBMIT(sorted(os.environ))")
    assert "FLEET_TEST_SECRET" not in reply.value["output"]
    assert "DAYTONA_API_KEY" not in reply.value["output"]
    await box.destroy()


async def _tool_run(
    box: DaytonaSandbox, code: str, relay: ToolRelay, tools: list[str]
) -> ExecuteReply:
    return await box.execute(
        context="main",
        code=code,
        variables={},
        blobs={},
        tools=tools,
        output_fields=None,
        wall_s=20,
        relay=relay,
    )


async def test_host_tools_are_relayed_as_the_sandbox_that_called_them(
    daytona: DaytonaProvider,
) -> None:
    seen: list[ToolCall] = []

    async def relay(call: ToolCall) -> ToolReply:
        seen.append(call)
        return ToolReply(ok=True, value=f"answer to {call.args[0]}")

    box = await daytona.create("sb-tools", LIMITS)
    reply = await _tool_run(box, "SUBMIT([llm_query('a'), llm_query('b')])", relay, ["llm_query"])
    assert reply.kind == "final"
    assert reply.value == {"output": ["answer to a", "answer to b"]}
    assert [(c.sandbox, c.context, c.name) for c in seen] == [("sb-tools", "main", "llm_query")] * 2
    await box.destroy()


async def test_forged_frames_written_by_the_cell_on_the_wire_are_refused(
    daytona: DaytonaProvider,
) -> None:
    seen: list[ToolCall] = []

    async def relay(call: ToolCall) -> ToolReply:
        seen.append(call)
        return ToolReply(ok=True, value="real")

    box = await daytona.create("sb-forge", LIMITS)
    # the cell writes its own frames: one naming another sandbox, then a replay of seq 1 under
    # a new file name, each waited on like a real call
    code = """
import json, os, time
def put(path, frame):
    open(path + '.tmp', 'w').write(json.dumps(frame))
    os.replace(path + '.tmp', path)
def wait(tok, seq):
    p = f'{tok}/{seq}.json'.replace('/calls/', '/replies/')
    while not os.path.exists(p):
        time.sleep(0.005)
    time.sleep(0.05)
    return json.load(open(p))
first = llm_query('x')
import glob
(tok,) = glob.glob('.fleet/*/calls/*')  # this cell's own call directory
put(f'{tok}/2.json', {'seq': 2, 'name': 'llm_query', 'sandbox': 'sb-victim'})
forged = wait(tok, 2)
put(f'{tok}/3.json', {'seq': 1, 'name': 'llm_query'})
replayed = wait(tok, 3)
SUBMIT([first, forged['ok'], forged['error'], replayed['ok'], replayed['error']])
"""
    reply = await _tool_run(box, code, relay, ["llm_query"])
    assert reply.kind == "final", reply
    first, forged_ok, forged_error, replayed_ok, replayed_error = reply.value["output"]
    assert first == "real"
    assert (forged_ok, replayed_ok) == (False, False)
    assert "malformed frame" in forged_error
    assert "replayed" in replayed_error
    assert [c.sandbox for c in seen] == ["sb-forge"]  # one real call; nothing else was relayed
    await box.destroy()


async def test_a_cell_past_its_wall_time_is_terminal_and_leaves_daytona_healthy(
    daytona: DaytonaProvider,
) -> None:
    box = await daytona.create("sb-loop", LIMITS)
    reply = await box.execute(
        context="main",
        code="while True:\n    pass",
        variables={},
        blobs={},
        tools=[],
        output_fields=None,
        wall_s=1,
        relay=_no_tools,
    )
    assert reply.kind == "terminal"
    assert "wall-time limit" in reply.error
    assert box.stopped_limit == "wall_time"
    assert daytona.circuit.failures == 0  # a user's loop is not Daytona failing
    assert daytona.circuit.health()["ok"] is True


async def test_an_answer_frame_printed_by_the_cell_is_output_the_helpers_answer_wins(
    daytona: DaytonaProvider,
) -> None:
    """The answer comes back with the cell's output, framed by the execution's token. A cell
    can learn its token and print a frame of its own: it stays output, and the helper's frame,
    written after everything the cell printed, is the answer."""
    box = await daytona.create("sb-frame", LIMITS)
    code = """
import sys
token = sys._getframe(1).f_locals['token']
print('[fleet-answer ' + token + ']{"kind": "final", "value": 666}[/fleet-answer ' + token + ']')
6 * 7
"""
    reply = await run(box, code)
    assert (reply.kind, reply.value) == ("result", 42)
    # the whole forged frame, this execution's token and all, is still there as output
    (forged,) = [line for line in reply.stdout.splitlines() if "666" in line]
    assert forged.startswith("[fleet-answer ")
    assert forged.endswith("]")
    assert "[/fleet-answer " in forged
    assert (await run(box, "print('plain')\nNone")).stdout == "plain\n"  # the frame is removed
    await box.destroy()


async def test_a_context_that_lost_the_helper_gets_it_again(daytona: DaytonaProvider) -> None:
    box = await daytona.create("sb-helper", LIMITS)
    assert (await run(box, "x = 1\nx")).value == 1
    assert (await run(box, f"del globals()[{HELPER_NAME!r}]\n'gone'")).value == "gone"
    assert (await run(box, "x + 1")).value == 2  # defined again, the variables kept
    await box.destroy()


async def test_closing_a_context_ends_its_interpreter_and_interrupt_drops_it(
    daytona: DaytonaProvider, fake: DaytonaFake
) -> None:
    """Before the fake answered a context delete with the JSON the SDK decodes, no context
    could be deleted (the SDK raised, and the circuit counted it)."""
    box = await daytona.create("sb-ctx", LIMITS)
    assert (await run(box, "x = 1\nx", context="a")).value == 1
    await box.close_context("a")
    (remote,) = [
        b for b in fake.sandboxes.values() if b.dto["labels"][f"{LABEL}/sandbox"] == "sb-ctx"
    ]
    assert remote.contexts == {}
    assert (await run(box, "'x' in globals()", context="a")).value is False  # a fresh one
    assert await box.interrupt("a") is True  # Daytona has no interrupt: the context goes
    assert await box.interrupt("a") is False
    assert daytona.circuit.failures == 0
    await box.destroy()
