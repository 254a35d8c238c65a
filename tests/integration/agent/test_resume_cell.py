"""Crash point "during a cell" (issue 16): the holder SIGKILLed while cell 2 waits in
`llm_query` on the scripted LM's gate (a FAKE model server). The resumed run reuses both
recorded step responses and cell 1, interrupts what the dead holder left running in the REPL
context, and runs cell 2 again (the step in flight): its `llm_query` is the one model call
asked twice. Cell 3 reads `x` (recorded cell 1) and `y` (the repeated cell 2). Ten kills, one
mesh (resume_kit)."""

import pytest

from fleet_events.run import CellExecuted, LlmCalled, RunResumed
from fleet_harness.scripted_lm import ScriptedLM

from .resume_kit import AGENT_ENV, gate_reached, run_rounds, script, summary
from .rlm_kit import Processes, of_type, processes, session

__all__ = ["AGENT_ENV", "processes"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
AGENTS = 2


async def test_a_kill_during_a_cell_runs_that_cell_again_in_the_same_repl_context(
    processes: Processes,
) -> None:
    with ScriptedLM(script) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            rounds = await run_rounds(processes, s, fake, "cell", gate_reached(fake))
    print(summary(rounds))
    for r in rounds:
        root = r.events["root"]
        resumed = of_type(root, RunResumed)[0]  # a second when a loaded holder was fenced too
        # dspy's facade set-up cell and cell 1 are reused; cell 2 (the third) runs again
        assert (resumed.reused_calls, resumed.reused_cells) == (2, 2), resumed
        assert resumed.in_flight.startswith("cell 3 (iteration 1, planned"), resumed
        cells = of_type(root, CellExecuted)
        assert [c.cell_id.rsplit("-", 1)[1] for c in cells] == ["c1", "c2", "c3", "c4"]
        assert len({c.context for c in cells}) == 1  # one REPL context, re-attached
        subs = [c for c in of_type(root, LlmCalled) if c.request_kind == "sub"]
        assert len(subs) == 1  # the repeated call is recorded once, by the resumed run
        assert subs[0].cell == cells[2].cell_id
