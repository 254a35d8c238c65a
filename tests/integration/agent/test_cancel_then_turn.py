"""A cancelled turn, then another turn of the same session in the same sandbox: the cancel
interrupts the first turn's cell, and the next turn's `SUBMIT` must still answer (it never did:
the runner left CPython's async-exception signal set, and SUBMIT's trace function then spun;
tests/integration/sandbox/test_interrupt_then_submit.py has it at the provider)."""

import pytest

from fleet_events.run import CellExecuted, RunStarted
from fleet_events.session import CancelRequested, TurnCancelled, TurnCompleted
from fleet_harness.scripted_lm import ScriptedLM
from fleet_harness.waits import eventually

from .rlm_kit import Processes, of_type, processes, session, step

__all__ = ["processes"]

AGENT_ENV = {
    "FLEET_AGENT_TURN_SLOTS": "2",
    "FLEET_ENGINE_MAX_ITERS": "4",
    "FLEET_ENGINE_MAX_LLM_CALLS": "3",
}

pytestmark = pytest.mark.timeout(240)


async def test_a_turn_after_a_cancelled_one_submits_in_the_same_sandbox(
    processes: Processes,
) -> None:
    sleep = "import time\nopen('cell-started', 'w').write('41')\ntime.sleep(300)"
    script = [
        step(sleep, reasoning="wait a long time"),
        step("SUBMIT(answer=f\"kept {int(open('cell-started').read()) + 1}\")", reasoning="now"),
    ]
    with ScriptedLM(script) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            first = await s.ask("sleep")

            async def cell_started() -> bool:
                try:
                    return (await s.workspace() / "cell-started").exists()
                except AssertionError:
                    return False

            await eventually(cell_started, timeout=60, what="the cell to start")
            await s.append(first, CancelRequested(reason="user pressed stop"))
            cancelled = await s.ended(first, timeout=60)
            second = await s.ask("answer now")
            # a hung SUBMIT would only end at the cell's wall time: the bound is well below
            ended = await s.ended(second, timeout=60)
            before = await s.run_events(first)
            after = await s.run_events(second)
    assert isinstance(cancelled, TurnCancelled), cancelled
    assert isinstance(ended, TurnCompleted), ended
    assert ended.answer == "kept 42"  # read from the file the interrupted cell wrote
    assert of_type(before, RunStarted)[0].sandbox == of_type(after, RunStarted)[0].sandbox
    finals = [c.final for c in of_type(after, CellExecuted) if c.final is not None]
    assert finals == [{"answer": "kept 42"}]
    assert sum(fake.calls.values()) == 2
