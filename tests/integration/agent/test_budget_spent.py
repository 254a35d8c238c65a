"""A turn whose model calls the budget refuses ends `budget_spent`, saying which cap, not as a
runner error (real broker, budget and agent processes; the scripted LM is a FAKE model server
that must never be reached). `test_budget_spent_chat.py` runs the same with the chat agent."""

from fleet_events.run import RunFailed
from fleet_events.session import TurnFailed
from fleet_harness.scripted_lm import Script, ScriptedLM

from .rlm_kit import Processes, of_type, processes, session, step

__all__ = ["processes"]

BUDGET_ENV = {"FLEET_BUDGET_DEFAULT_TENANT_CAPS": '{"calls_per_day": 0}'}


async def ends_budget_spent(processes: Processes, script: Script) -> None:
    """A tenant with a daily cap of 0 calls asks once: the turn fails, naming the cap, and no
    module (a cheaper fallback included) reaches the model."""
    with ScriptedLM(script) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            turn = await s.ask("anything at all")
            ended = await s.ended(turn)
            events = await s.run_events(turn)
    assert isinstance(ended, TurnFailed), ended
    assert (ended.code, ended.retryable) == ("budget_spent", False), ended
    assert "daily cap of 0 LLM calls" in ended.error, ended.error
    assert [f.reason for f in of_type(events, RunFailed)] == ["budget_spent"]
    assert sum(fake.calls.values()) == 0  # refused before any model call


async def test_a_refused_first_step_ends_the_turn_budget_spent_naming_the_cap(
    processes: Processes,
) -> None:
    await ends_budget_spent(processes, [step("SUBMIT(answer='never asked')")])
