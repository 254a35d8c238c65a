"""A depth-3, fan-out-4 tree (84 child runs) on ONE agent replica with 2 child slots runs to
the end: a parent waiting on its children lends its slot back, so the slots are always held
by runs that work. Without that, two depth-1 children hold both slots waiting for
grandchildren that never get one (seen at depth 2: the turn never ends).

The tenant's isolation mode is `context` (each child a fresh REPL context on the session's
sandbox): the property under test is the slots, not the sandboxes. Under the fork policy one
fork family shares one uid's process limit, and 84 forks pass it (the broker's part,
docs/engine.md). Each policy decision is still an event, and the test counts them by branch.
"""

import re

import pytest

from fleet_events import bus
from fleet_events.bus import Ping
from fleet_events.run import ChildRunCompleted, RunStarted
from fleet_events.sandbox import ChildIsolationDecided
from fleet_events.session import TurnCompleted
from fleet_harness.scripted_lm import Reply, ScriptedLM, ScriptedRequest
from fleet_mesh import rpc
from fleet_mesh.runtime_config import RuntimeConfig

from .rlm_kit import Processes, of_type, processes, session, step

__all__ = ["processes"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

AGENT_ENV = {
    "FLEET_AGENT_TURN_SLOTS": "1",
    "FLEET_ENGINE_CHILD_SLOTS": "2",
    "FLEET_ENGINE_MAX_ITERS": "3",
    "FLEET_ENGINE_MAX_DEPTH": "3",
    "FLEET_ENGINE_MAX_LLM_CALLS": "10",
}
# every waiting parent's sub_rlm_batched is a host call in flight on the one sandbox
# (1 + 4 + 16 = 21 at most); the broker's default cap is 8 per sandbox
BROKER_ENV = {"FLEET_SANDBOX_MAX_TOOL_CALLS": "32"}
DEPTH, FAN_OUT = 3, 4
FAN = f"answers = sub_rlm_batched([f'node {{me}}.{{i}}' for i in range({FAN_OUT})])"


def tree_script(request: ScriptedRequest) -> Reply:
    """The root and each inner node fan out, then submit the sum of their children's answers;
    a leaf (depth `DEPTH`) submits 1. A node's own name is the first one in its prompt (its task
    variable comes before its history)."""
    text = request.prompt_text
    fanned = "answers = sub_rlm_batched" in text
    total = step("SUBMIT(answer=str(sum(int(a) for a in answers)))")
    if "ROOT" in text:
        return Reply(total if fanned else step("me = 'r'\n" + FAN), key="root")
    found = re.search(r"node (r(?:\.\d)+)", text)
    assert found, "a request from no node of the tree"
    name = found.group(1)
    depth = name.count(".")
    if depth == DEPTH:
        return Reply(step("SUBMIT(answer='1')"), key="leaf")
    return Reply(total if fanned else step(f"me = {name!r}\n" + FAN), key=f"depth-{depth}")


async def test_a_depth_3_fan_out_4_tree_runs_on_one_replica_with_two_slots(
    processes: Processes,
) -> None:
    with ScriptedLM(tree_script) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            config = await RuntimeConfig.open(s.nc.jetstream())
            await config.set("rlm_child_isolation_mode", "context", tenant=s.tenant)
            turn = await s.ask("ROOT: count the leaves")
            ended = await s.ended(turn, timeout=120)
            events = await s.run_events(turn)
            (started,) = of_type(events, RunStarted)
            decided = of_type(await s.sandbox_events(started.sandbox), ChildIsolationDecided)
            pong = await rpc.call_verb(s.nc, bus.ping("agent"), Ping(), timeout=5)
    assert isinstance(ended, TurnCompleted), ended
    assert ended.answer == str(FAN_OUT**DEPTH)
    assert len(of_type(events, ChildRunCompleted)) == FAN_OUT
    children = sum(FAN_OUT**d for d in range(1, DEPTH + 1))
    assert {d.branch for d in decided} == {"context"}
    assert len(decided) == children
    inner = {f"depth-{d}": 2 * FAN_OUT**d for d in range(1, DEPTH)}
    assert fake.calls == {"root": 2, **inner, "leaf": FAN_OUT**DEPTH}
    details = pong.details
    assert details["child_slots"] == 2
    # never more than the 2 slots worked at once, while far more runs were open (waiting)
    assert details["children_busy_peak"] <= 2
    assert details["children_peak"] > 2
    assert details["children_handled"] == children
    assert details["child_slots_lent"] == 0  # every lent slot was taken back
