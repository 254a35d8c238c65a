"""Crash point "before a step" (issue 16): the holder SIGKILLed while the root's second step
call waits at the scripted LM's gate (a FAKE model server). The other replica resumes the run:
step 1's response and cell 1 come from the record (the fake sees step 1 once), step 2's call
is the one in flight and is asked again, and its cell reads `x`, made by the recorded cell 1 in
the REPL context the resumed run re-attached. Ten kills, one mesh (resume_kit)."""

import pytest

from fleet_events.run import CellExecuted, RunResumed
from fleet_harness.scripted_lm import ScriptedLM

from .resume_kit import AGENT_ENV, gate_reached, run_rounds, script, summary
from .rlm_kit import Processes, of_type, processes, session

__all__ = ["AGENT_ENV", "processes"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
AGENTS = 2


async def test_a_kill_before_a_step_resumes_the_run_and_repeats_only_that_step(
    processes: Processes,
) -> None:
    with ScriptedLM(script) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            rounds = await run_rounds(processes, s, fake, "step", gate_reached(fake))
    print(summary(rounds))
    for r in rounds:
        root = r.events["root"]
        resumed = of_type(root, RunResumed)[0]  # a second when a loaded holder was fenced too
        # dspy's facade set-up cell and cell 1 ran once, before the kill; cell 2 after it
        assert (resumed.reused_calls, resumed.reused_cells) == (1, 2), resumed
        assert resumed.in_flight == "model call 2 (no response recorded)"
        cells = of_type(root, CellExecuted)
        assert [c.cell_id.rsplit("-", 1)[1] for c in cells] == ["c1", "c2", "c3"]
        assert root.index(cells[1]) < root.index(resumed) < root.index(cells[2])
