"""After an interrupt, `SUBMIT` in the same sandbox process still answers (a bug: the next
SUBMIT's cell thread spun in `Submission.__init__` and the cell never answered), in the
interrupted context and in another context of the same process, on both sandbox kinds."""

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from fleet_events.sandbox import ExecuteReply
from fleet_harness.waits import eventually
from fleet_sandbox_broker.providers.local import LocalProvider, LocalSandbox

from .provider_kit import LIMITS, no_tools, provider, uid_block, value

UID_BASE = uid_block(360300)

STARTED = "kept = 41\nopen('started', 'w').close()\n"
BUSY = STARTED + "while True:\n    pass"
SLEEP = STARTED + "import time\ntime.sleep(60)"
SWALLOWS = STARTED + (
    "while True:\n    try:\n        while True:\n            pass\n"
    "    except BaseException:\n        pass"
)
FIELDS = [{"name": "answer", "type": "int"}]
# the bound only turns a hang into a failure: a SUBMIT cell answers in milliseconds
ANSWER_BOUND_S = 20


@pytest.fixture
async def local(tmp_path: Path) -> AsyncIterator[LocalProvider]:
    async with provider(tmp_path, UID_BASE) as made:
        yield made


@pytest.fixture(params=[True, False], ids=["fork_ready", "no_checkpoints"])
async def box(local: LocalProvider, request: pytest.FixtureRequest) -> AsyncIterator[LocalSandbox]:
    made = await local.create("intr-submit", LIMITS, fork_ready=request.param)
    yield made
    await made.destroy()


async def cell(
    box: LocalSandbox, code: str, *, context: str = "main", fields: Any = None
) -> ExecuteReply:
    if context not in box.contexts:
        await box.open_context(context)
    run = box.execute(
        context=context, code=code, variables={}, blobs={}, tools=[],
        output_fields=fields, wall_s=30, relay=no_tools,
    )  # fmt: skip
    return await asyncio.wait_for(run, ANSWER_BOUND_S)


async def interrupt_a_running_cell(box: LocalSandbox, code: str) -> ExecuteReply:
    started = box.workspace / "started"
    started.unlink(missing_ok=True)
    running = asyncio.create_task(cell(box, code))
    await eventually(started.exists, timeout=20, what="the cell running")
    assert await box.interrupt("main") is True
    reply = await running
    assert reply.kind == "error"
    assert "interrupted" in reply.error
    return reply


def submitted(reply: ExecuteReply) -> Any:
    assert reply.kind == "final", reply
    return reply.value


@pytest.mark.parametrize("code", [BUSY, SLEEP, SWALLOWS], ids=["busy", "sleep", "swallows"])
async def test_submit_answers_after_an_interrupt(box: LocalSandbox, code: str) -> None:
    assert submitted(await cell(box, "SUBMIT(answer=1)", fields=FIELDS)) == {"answer": 1}
    await interrupt_a_running_cell(box, code)
    # the interrupted context: its variables kept, and SUBMIT answers (typed and untyped)
    assert submitted(await cell(box, "SUBMIT(answer=kept + 1)", fields=FIELDS)) == {"answer": 42}
    assert submitted(await cell(box, "SUBMIT(kept)")) == {"output": 41}
    # another context of the same process
    assert submitted(await cell(box, "SUBMIT(answer=7)", context="other", fields=FIELDS)) == {
        "answer": 7
    }
    # and ordinary cells after the SUBMITs still run and see no stray trace or exception
    assert value(await cell(box, "kept * 2")) == 82
    assert value(await cell(box, "sum(range(10))", context="other")) == 45
    # the same root cause hung any cell with a trace function of its own (SUBMIT sets one)
    assert value(await cell(box, TRACED)) == 3


TRACED = """
import sys
def tracer(frame, event, arg):
    return None
def three():
    return 3
sys.settrace(tracer)
try:
    got = three()
finally:
    sys.settrace(None)
got
"""


async def test_submit_answers_after_two_interrupts_in_a_row(box: LocalSandbox) -> None:
    await interrupt_a_running_cell(box, BUSY)
    await interrupt_a_running_cell(box, SLEEP)
    assert submitted(await cell(box, "SUBMIT(answer=kept)", fields=FIELDS)) == {"answer": 41}
    assert submitted(await cell(box, "SUBMIT(answer=2)", context="other", fields=FIELDS)) == {
        "answer": 2
    }
