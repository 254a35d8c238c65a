"""A tree's caps bind every model call of a turn (issue 27, H1): model-written code that calls
`sub_rlm` in a loop, sequentially or batched, at every depth, stops at the tenant's
`rlm_max_tree_calls`; `rlm_max_child_runs` bounds the children. Before the cap existed the same
loop made 833 calls under a "cap" of 50: `max_llm_calls` counts sub calls only (dspy's meaning)
and each run's own steps were bounded per run.

A real broker, budget and agent replica as processes; the scripted LM (a FAKE model server)
answers every run with the same loop, as a prompt injection in a document would make it.
"""

from collections.abc import Callable

import pytest

from fleet_events.run import ChildRunFailed
from fleet_events.session import TurnCompleted, TurnFailed
from fleet_harness.scripted_lm import Reply, ScriptedLM, ScriptedRequest
from fleet_mesh.runtime_config import RuntimeConfig

from .rlm_kit import Processes, of_type, processes, session, step

__all__ = ["processes"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

AGENT_ENV = {
    "FLEET_AGENT_TURN_SLOTS": "2",
    "FLEET_ENGINE_CHILD_SLOTS": "8",
    "FLEET_ENGINE_MAX_ITERS": "4",
    "FLEET_ENGINE_MAX_DEPTH": "3",
    # the agent's own defaults are generous: the tenant's settings are what must bind
    "FLEET_ENGINE_MAX_LLM_CALLS": "1000",
    "FLEET_ENGINE_MAX_TREE_CALLS": "5000",
}

SEQUENTIAL = """\
made, refused = 0, []
for i in range(8):
    try:
        sub_rlm('go deeper')
        made += 1
    except Exception as exc:
        refused.append(str(exc)[:200])
print('loop done', made, len(refused))
"""
BATCHED = """\
made, refused = 0, []
for i in range(3):
    try:
        sub_rlm_batched(['go deeper'] * 4)
        made += 4
    except Exception as exc:
        refused.append(str(exc)[:200])
print('loop done', made, len(refused))
"""


def looping(code: str) -> Callable[[ScriptedRequest], Reply]:
    """Every run, root and child alike, runs `code`, then submits what it counted."""

    def answer(request: ScriptedRequest) -> Reply:
        if "loop done" in request.prompt_text:
            return Reply(step("SUBMIT(answer=f'{made} made, {len(refused)} refused')"))
        return Reply(step(code))

    return answer


@pytest.mark.parametrize(("code", "cap"), [(SEQUENTIAL, 20), (BATCHED, 24)], ids=["seq", "batch"])
async def test_a_sub_rlm_loop_stops_at_the_tenants_tree_call_cap(
    processes: Processes, code: str, cap: int
) -> None:
    with ScriptedLM(looping(code)) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            config = await RuntimeConfig.open(s.nc.jetstream())
            await config.set("rlm_child_isolation_mode", "context", tenant=s.tenant)
            await config.set("rlm_max_tree_calls", str(cap), tenant=s.tenant)
            turn = await s.ask("ROOT: summarise the document")
            ended = await s.ended(turn, timeout=240)
            tree = await s.tree(turn)
            events = await s.run_events(turn)
            made = sum(fake.calls.values())
    # the tree opened with the tenant's setting, not the agent's environment (M1)
    assert tree.max_tree_calls == cap
    # every model call of the tree was granted against the cap, whoever made it; a grant
    # precedes its call, so the calls made never pass it (none are in flight past it)
    assert made <= cap
    assert tree.tree_calls == cap
    assert tree.refusals >= 1
    # the loop saw its sub_rlm calls fail and went on; the root's own next step was refused,
    # so the turn ends budget_spent naming the cap, not with a made-up answer
    assert of_type(events, ChildRunFailed)
    assert isinstance(ended, TurnFailed), ended
    assert ended.code == "budget_spent"
    assert f"max_tree_calls {cap}" in ended.error


async def test_the_tenants_child_run_cap_refuses_sub_rlm_as_an_error_the_code_catches(
    processes: Processes,
) -> None:
    with ScriptedLM(looping(SEQUENTIAL)) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            config = await RuntimeConfig.open(s.nc.jetstream())
            await config.set("rlm_child_isolation_mode", "context", tenant=s.tenant)
            await config.set("rlm_max_child_runs", "3", tenant=s.tenant)
            await config.set("rlm_max_depth", "1", tenant=s.tenant)
            turn = await s.ask("ROOT: summarise the document")
            ended = await s.ended(turn, timeout=240)
            tree = await s.tree(turn)
            events = await s.run_events(turn)
    assert (tree.max_child_runs, tree.max_depth, tree.child_runs) == (3, 1, 3)
    over = [e for e in of_type(events, ChildRunFailed) if "max_child_runs 3" in e.error]
    assert len(over) == 5  # the root's eight sub_rlm calls: three admitted, five refused
    # the root's code caught the refusals and submitted what it counted
    assert isinstance(ended, TurnCompleted), ended
    assert ended.answer == "3 made, 5 refused"
