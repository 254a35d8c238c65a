"""Sandbox code that writes its own `tool` frames for the running cell (the attack: 300 frames
gave 289 host threads, still running after the cell ended). Concurrent host calls per sandbox
are bounded, extra ones are refused at once, and a cell's calls end when the cell does."""

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fleet_events.sandbox import ToolCall, ToolReply
from fleet_harness.waits import eventually
from fleet_sandbox_broker.providers.local import LocalProvider

from .provider_kit import LIMITS, provider, run, uid_block, value

UID_BASE = uid_block(360100)

# The cell finds its own execution id (the runner's Execution object) and writes raw frames on
# every socket it holds: the channel is one of them.
FLOOD = """
import gc, json, os, struct
exec_id = next(o.id for o in gc.get_objects() if type(o).__name__ == 'Execution')
def link(fd):
    try:
        return os.readlink('/proc/self/fd/' + fd)
    except OSError:
        return ''
socks = [int(fd) for fd in os.listdir('/proc/self/fd') if link(fd).startswith('socket:')]
for i in range(300):
    body = json.dumps({'t': 'tool', 'id': 10**6 + i, 'exec': exec_id, 'name': 'slow'}).encode()
    for fd in socks:
        os.write(fd, struct.pack('>I', len(body)) + body)
'flooded'
"""


class SlowTool:
    """A host tool that never answers by itself: each call stays in flight until cancelled."""

    def __init__(self) -> None:
        self.active = 0
        self.most = 0
        self.calls = 0

    async def __call__(self, call: ToolCall) -> ToolReply:
        self.calls += 1
        self.active += 1
        self.most = max(self.most, self.active)
        try:
            await asyncio.Event().wait()
        finally:
            self.active -= 1
        raise AssertionError("unreachable")


@pytest.fixture
async def local(tmp_path: Path) -> AsyncIterator[LocalProvider]:
    async with provider(tmp_path, UID_BASE, max_tool_calls=8) as made:
        yield made


async def test_a_flood_of_forged_tool_frames_is_bounded_and_ends_with_the_cell(
    local: LocalProvider,
) -> None:
    box = await local.create("flood", LIMITS, fork_ready=False)
    tool = SlowTool()
    try:
        assert value(await run(box, FLOOD, relay=tool)) == "flooded"
        # the frames come before the cell's answer on one socket: all were seen, at most 8
        # became host calls (those may be cancelled before they start: the cell has ended)
        assert tool.most <= 8
        assert tool.calls <= 8
        await eventually(lambda: tool.active == 0, timeout=20, what="the cell's host calls ended")
        await eventually(
            lambda: not box.tool_tasks, timeout=20, what="no host-call task left in the broker"
        )
        assert box.running
        assert value(await run(box, "6 * 7", relay=tool)) == 42
    finally:
        await box.destroy()


async def test_a_call_over_the_bound_raises_in_the_cell_with_the_reason(tmp_path: Path) -> None:
    """One forged call holds the only slot; the cell's own call, behind it on the socket, is
    refused at once with a reason the cell can read, and the sandbox carries on."""
    async with provider(tmp_path, UID_BASE + 50, max_tool_calls=1) as local:
        box = await local.create("bound", LIMITS, fork_ready=False)
        tool = SlowTool()
        code = FLOOD.replace("range(300)", "range(1)").replace("'flooded'", "") + (
            "try:\n    slow()\nexcept RuntimeError as e:\n    refused = str(e)\nrefused"
        )
        try:
            refused = value(await run(box, code, tools=["slow"], relay=tool))
            assert refused == (
                "host tool 'slow' refused: 1 host tool calls of this sandbox are already in "
                "flight (at most 1 at once)"
            )
            await eventually(lambda: tool.active == 0, timeout=20, what="the forged call ended")
            assert value(await run(box, "6 * 7")) == 42
        finally:
            await box.destroy()


# A cell writing 500 `out` frames of its own on the runner's channel (a flood of live
# previews): the broker passes on at most one per 50 ms and `output_cap` characters per cell,
# and the cell answers.
OUT_FLOOD = """
import gc, json, os, struct
exec_id = next(o.id for o in gc.get_objects() if type(o).__name__ == 'Execution')
runner = next(o for o in gc.get_objects() if type(o).__name__ == 'Runner')
for i in range(500):
    body = json.dumps({'t': 'out', 'exec': exec_id, 'text': 'forged ' * 10}).encode()
    runner.channel.send_encoded(body)
'flooded'
"""


async def test_a_flood_of_forged_output_frames_is_bounded(local: LocalProvider) -> None:
    box = await local.create("out-flood", LIMITS)
    heard: list[str] = []

    async def sink(text: str) -> None:
        heard.append(text)

    try:
        await box.open_context("main")
        reply = await box.execute(
            context="main", code=OUT_FLOOD, variables={}, blobs={}, tools=[],
            output_fields=None, wall_s=30, relay=SlowTool(), on_output=sink,
        )  # fmt: skip
        assert value(reply) == "flooded"
        assert 1 <= len(heard) <= 20  # 500 written; a loaded machine may space a few out
        assert box.running
        assert value(await run(box, "6 * 7")) == 42
    finally:
        await box.destroy()
