"""Interrupting a running cell at the provider (a cancelled turn must not wait out `wall_s`):
the cell stops within a second, its reply says it was interrupted, and the sandbox, its process
and its variables are still there for the next cell."""

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from fleet_events.sandbox import ExecuteReply, ToolCall, ToolReply
from fleet_harness.waits import eventually
from fleet_sandbox_broker.providers.local import LocalProvider, LocalSandbox

from .provider_kit import LIMITS, provider, run, uid_block, value

UID_BASE = uid_block(360200)


@pytest.fixture
async def local(tmp_path: Path) -> AsyncIterator[LocalProvider]:
    async with provider(tmp_path, UID_BASE) as made:
        yield made


@pytest.fixture(params=[True, False], ids=["fork_ready", "no_checkpoints"])
async def box(local: LocalProvider, request: pytest.FixtureRequest) -> AsyncIterator[LocalSandbox]:
    made = await local.create("intr", LIMITS, fork_ready=request.param)
    yield made
    await made.destroy()


async def interrupted(box: LocalSandbox, code: str, **kw: Any) -> ExecuteReply:
    """Start `code`, wait until it says it has started (a file), interrupt it; the cell's
    reply. The bound only catches a hang: how fast an interrupt lands is bench/ work."""
    started = box.workspace / "started"
    started.unlink(missing_ok=True)
    cell = asyncio.create_task(run(box, code, **kw))
    await eventually(started.exists, timeout=20, what="the cell running")
    assert await box.interrupt("main") is True
    return await asyncio.wait_for(cell, 30)


async def threads_left(box: LocalSandbox) -> int:
    return int(value(await run(box, "import threading\nthreading.active_count()")))


async def back_to(box: LocalSandbox, threads: int) -> bool:
    return await threads_left(box) == threads


STARTED = "before = 1\nopen('started', 'w').close()\n"
BUSY = STARTED + "while True:\n    pass"
SLEEP = STARTED + "import time\ntime.sleep(60)"
SWALLOWS = STARTED + (
    "while True:\n    try:\n        while True:\n            pass\n"
    "    except BaseException:\n        pass"
)


@pytest.mark.parametrize("code", [BUSY, SLEEP], ids=["busy_loop", "sleep_60"])
async def test_an_interrupted_cell_stops_and_the_sandbox_keeps_its_state(
    box: LocalSandbox, code: str
) -> None:
    assert value(await run(box, "kept = 'from an earlier cell'")) is None
    threads = await threads_left(box)
    pid = box.pid
    reply = await interrupted(box, code)
    assert reply.kind == "error"
    assert "the cell was interrupted" in reply.error
    # the interrupted code is gone, not left running beside the next cells
    await eventually(lambda: back_to(box, threads), timeout=20, what="the cell's thread gone")
    assert box.running
    assert box.pid == pid
    assert value(await run(box, "(kept, before)")) == ["from an earlier cell", 1]


async def test_a_cell_blocked_on_a_host_tool_is_interrupted(box: LocalSandbox) -> None:
    async def never(call: ToolCall) -> ToolReply:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    reply = await interrupted(box, STARTED + "wait()", tools=["wait"], relay=never)
    assert reply.kind == "error"
    assert "interrupted" in reply.error
    assert not box.tool_tasks
    assert value(await run(box, "before + 1")) == 2


async def test_a_cell_that_swallows_the_interrupt_is_still_answered(box: LocalSandbox) -> None:
    """`except BaseException: pass` in a loop: the reply still comes within the second, and
    the context takes new cells (the stray thread is what a cell leaves running)."""
    reply = await interrupted(box, SWALLOWS)
    assert reply.kind == "error"
    assert "did not stop within 0.5 s" in reply.error
    assert value(await run(box, "before")) == 1
    # later cells run on a fresh long-lived cell thread, never behind the stray (which holds
    # the old one: each cell waited a second for it, then got a thread of its own)
    names = [value(await run(box, "import threading\nthreading.current_thread().name"))
             for _ in range(3)]  # fmt: skip
    assert names == ["cell", "cell", "cell"]


async def test_interrupt_with_nothing_running_says_so(box: LocalSandbox) -> None:
    assert await box.interrupt("main") is False
    assert value(await run(box, "1 + 1")) == 2
    assert await box.interrupt("main") is False
    assert await box.interrupt("no-such-context") is False


WEDGE = """
import gc, time
runner = next(o for o in gc.get_objects() if type(o).__name__ == 'Runner')
runner.channel.lock.acquire()  # the lock every frame to the broker is sent under
open('wedged', 'w').close()
time.sleep(60)
"""


@pytest.mark.slow
async def test_a_runner_too_wedged_to_answer_is_stopped_with_its_cell(box: LocalSandbox) -> None:
    """The cell takes the runner's send lock and never gives it back: nothing in the sandbox
    can answer the interrupt, so the sandbox is stopped (the cell with it) once the
    interrupt's own deadline passes."""
    cell = asyncio.create_task(run(box, WEDGE))
    wedged = box.workspace / "wedged"
    await eventually(wedged.exists, timeout=20, what="the cell holding the send lock")
    assert await box.interrupt("main") is True
    reply = await asyncio.wait_for(cell, 10)
    assert reply.kind == "terminal"
    assert "did not answer an interrupt within 5 s" in reply.error
    assert box.stopped_limit == "protocol"
