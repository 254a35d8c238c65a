"""Crash point "while children run" (issue 16): the root's holder SIGKILLed while both child
runs wait at the scripted LM's gate (a FAKE model server). The resumed root runs its cell in
flight again: `sub_rlm_batched` asks for the same two child runs (derived ids), which are
re-attached, not started twice: a child on the survivor keeps running, a child that died with
the killed replica is resumed from its own record. Ten kills, one mesh (resume_kit)."""

import pytest

from fleet_events.run import ChildRunCompleted, ChildRunRequested, RunResumed
from fleet_harness.scripted_lm import ScriptedLM

from .resume_kit import AGENT_ENV, gate_reached, run_rounds, script, summary
from .rlm_kit import Processes, of_type, processes, session

__all__ = ["AGENT_ENV", "processes"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
AGENTS = 2


async def test_a_kill_while_children_run_reattaches_them(processes: Processes) -> None:
    with ScriptedLM(script) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            rounds = await run_rounds(processes, s, fake, "children", gate_reached(fake, 2))
    print(summary(rounds))
    resumed_children = 0
    for r in rounds:
        root = r.events["root"]
        assert of_type(root, RunResumed)  # two when a loaded holder was also taken over
        requested = of_type(root, ChildRunRequested)
        assert len(requested) == 2  # asked once each, whatever the resume did
        completed = of_type(root, ChildRunCompleted)
        assert sorted(c.answer for c in completed) == ["A", "B"]
        for child in requested:
            resumed_children += len(of_type(r.events[child.child_run], RunResumed))
    print(f"children resumed from their record: {resumed_children}")
