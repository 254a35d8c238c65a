"""The chat agent's turn whose first model call the budget refuses ends `budget_spent`, and no
cheaper module is tried (it would ask the budget for a call too): as `test_budget_spent.py`,
with the chat runner."""

from fleet_events.run import RunFailed
from fleet_events.session import TurnFailed
from fleet_harness.scripted_lm import ScriptedLM

from .rlm_kit import Processes, of_type, processes, session

__all__ = ["processes"]

BUDGET_ENV = {"FLEET_BUDGET_DEFAULT_TENANT_CAPS": '{"calls_per_day": 0}'}
AGENT_ENV = {"FLEET_AGENT_RUNNER": "chat"}


async def test_a_refused_first_step_ends_the_turn_budget_spent_naming_the_cap(
    processes: Processes,
) -> None:
    with ScriptedLM(["never asked"]) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            turn = await s.ask("anything at all")
            ended = await s.ended(turn)
            events = await s.run_events(turn)
    assert isinstance(ended, TurnFailed), ended
    assert (ended.code, ended.retryable) == ("budget_spent", False), ended
    assert "daily cap of 0 LLM calls" in ended.error, ended.error
    failed = of_type(events, RunFailed)
    assert [f.reason for f in failed] == ["budget_spent"]
    assert sum(fake.calls.values()) == 0  # refused before any model call
