"""Two agent replicas share one tree's children: child runs are work items on one shared
consumer, so either replica takes any child, and the tree still completes exactly once.

Each replica has ONE child slot, and every depth-1 child's first model call waits at a gate
of the scripted LM (a FAKE model server) until two of them are there: two children running at
once can only be on two replicas, so both replicas are shown to take children by
construction, not by luck; the test then reads who started each child run (the envelope's
actor). Real broker, budget and two agent processes, real sandboxes.
"""

import re
from collections import Counter

import pytest

from fleet_agent.engine import root_run_id
from fleet_events.run import ChildRunCompleted, RunCompleted, RunStarted
from fleet_events.session import TurnCompleted, TurnStarted
from fleet_harness.scripted_lm import Reply, ScriptedLM, ScriptedRequest
from fleet_harness.waits import eventually

from .rlm_kit import TERMINAL, Processes, of_type, processes, session, step

__all__ = ["processes"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

AGENTS = 2
AGENT_ENV = {
    "FLEET_AGENT_TURN_SLOTS": "1",
    "FLEET_ENGINE_CHILD_SLOTS": "1",
    "FLEET_ENGINE_MAX_ITERS": "3",
    "FLEET_ENGINE_MAX_DEPTH": "2",
    "FLEET_ENGINE_MAX_LLM_CALLS": "10",
}
FAN_OUT, LEAVES = 4, 2
CHILDREN = FAN_OUT + FAN_OUT * LEAVES
GATE = "depth-1-first"


def fan(names: str, count: int) -> str:
    return f"answers = sub_rlm_batched([f'node {names}.{{i}}' for i in range({count})])"


TOTAL = "SUBMIT(answer=str(sum(int(a) for a in answers)))"


def script(request: ScriptedRequest) -> Reply:
    """The root fans out to 4 children, each child to 2 leaves; a leaf submits 1, every other
    node the sum of its children. A depth-1 child's first call waits at the gate."""
    text = request.prompt_text
    fanned = "answers = sub_rlm_batched" in text
    if "ROOT" in text:
        return Reply(step(TOTAL if fanned else fan("r", FAN_OUT)), key="root")
    found = re.search(r"node (r(?:\.\d)+)", text)
    assert found, "a request from no node of the tree"
    name = found.group(1)
    if name.count(".") == 2:
        return Reply(step("SUBMIT(answer='1')"), key="leaf")
    if fanned:
        return Reply(step(TOTAL), key="depth-1")
    return Reply(step(fan(name, LEAVES)), key="depth-1-fan", gate=GATE)


async def test_two_replicas_share_one_trees_children_and_it_completes_once(
    processes: Processes,
) -> None:
    with ScriptedLM(script) as fake:
        gate = fake.gate(GATE)
        async with session(processes) as s:
            await s.use_model(fake)
            turn = await s.ask("ROOT: count the leaves")
            # two depth-1 children in a model call at once: one per replica (one slot each)
            await eventually(lambda: gate.arrivals >= 2, timeout=60, what="two children at once")
            gate.release()
            ended = await s.ended(turn, timeout=120)
            root = root_run_id(s.tenant, s.session, turn)
            runs = await s.read(f"fleet.session.{s.tenant}.{s.session}.run.>")
            log = await s.log()
    assert isinstance(ended, TurnCompleted), ended
    assert ended.answer == str(FAN_OUT * LEAVES)
    assert len([e for e in log if isinstance(e, TERMINAL)]) == 1  # the turn ended once
    assert len([e for e in log if isinstance(e, TurnStarted)]) == 1  # and ran once
    started = [e for e in runs if isinstance(e.data, RunStarted) and e.run != root]
    by_replica = Counter(e.actor.replica for e in started)
    assert len(by_replica) == AGENTS, by_replica  # both replicas took children
    assert sum(by_replica.values()) == CHILDREN
    assert len({e.run for e in started}) == CHILDREN  # every child started once, on one replica
    completed = [e for e in runs if isinstance(e.data, RunCompleted) and e.run != root]
    assert len({e.run for e in completed}) == len(completed) == CHILDREN
    answers = [e.data for e in runs if isinstance(e.data, ChildRunCompleted)]
    assert len(answers) == CHILDREN  # each parent got each child's answer once
    assert len(of_type([e.data for e in runs if e.run == root], ChildRunCompleted)) == FAN_OUT
    assert fake.calls == {
        "root": 2, "depth-1-fan": FAN_OUT, "depth-1": FAN_OUT, "leaf": FAN_OUT * LEAVES,
    }  # fmt: skip
