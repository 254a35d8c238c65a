"""The chat agent's turn whose first model call the budget refuses ends `budget_spent`, and no
cheaper module is tried (it would ask the budget for a call too): as `test_budget_spent.py`,
with the chat runner."""

from .rlm_kit import Processes, processes
from .test_budget_spent import BUDGET_ENV, ends_budget_spent

__all__ = ["BUDGET_ENV", "processes"]

AGENT_ENV = {"FLEET_AGENT_RUNNER": "chat"}


async def test_a_refused_first_step_ends_the_turn_budget_spent_naming_the_cap(
    processes: Processes,
) -> None:
    await ends_budget_spent(processes, ["never asked"])
