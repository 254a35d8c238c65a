"""Issue 16 for the chat runner (`FLEET_AGENT_RUNNER=chat`): a chat turn's holder SIGKILLed
mid-ReAct at a point reached by a gate in the scripted LM (a FAKE model server), and the other
replica carries the turn on from its run's record (`chat.resume.crashed`). Two crash points:

- "after a tool call returned": ReAct's `rlm_query` call has its result on the record and the
  next ReAct step's model call waits at the gate. The resumed run rebuilds the trajectory, so
  the only call asked twice is that step's (the one in flight); the tool does not run again.
- "during a tool call": the `rlm_query` tool's child RLM run waits at the gate on its model
  call. The tool call has no result: it runs again under its recorded id, so the child run is
  the same one, and the engine resumes it from its own record (its in-flight call is the one
  asked twice).
- "in the RLM route": an `rlm_only` turn (recorded `run.escalated` cot -> rlm) killed while
  the route's child run waits at the gate on its model call. The resumed chat run does not
  record the move again and calls the route's child again under its id; the engine resumes it.

Each round checks: the turn ends once, with the answer that needs the tool's result; no event
is stored twice on the root or the child run (`journal.step_key`); the model calls counted at
the fake, per script key, are the expected ones (once, or twice for the one in flight); the
tool was called once on the record. The turn went CoT -> ReAct first (CoT asked once).
"""

import json
import os
import re
import time
from collections import Counter
from dataclasses import dataclass

import pytest

from fleet_events import Event, new_id
from fleet_events.journal import step_key
from fleet_events.run import (
    TERMINAL,
    ChildRunRequested,
    Escalated,
    RunCompleted,
    RunResumed,
    RunStarted,
    ToolCalled,
    ToolReturned,
)
from fleet_events.session import TurnCompleted, TurnRequested, TurnStarted, log_subject
from fleet_harness.scripted_lm import Reply, ScriptedLM, ScriptedRequest
from fleet_harness.waits import WaitTimeout, eventually

from .resume_kit import TERMINAL_TURN, agents, holder, next_step_after, where
from .rlm_kit import Processes, Session, fields, of_type, processes, session, step

__all__ = ["processes"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
AGENTS = 2
AGENT_ENV = {
    "FLEET_AGENT_RUNNER": "chat",
    "FLEET_AGENT_TURN_SLOTS": "2",
    "FLEET_AGENT_ACK_WAIT_S": "2",  # as resume_kit: a live holder is not taken over on load
    "FLEET_ENGINE_ACK_WAIT_S": "2",
    "FLEET_ENGINE_MAX_ITERS": "4",
}
KILLS = int(os.environ.get("FLEET_RESUME_CHAT_KILLS", "3"))
ANSWER = "KIDANSWER-42"
EXPECTED = {
    # script key -> calls at the fake: once, or twice for the call in flight at the kill
    "after": {"cot": 1, "s1": 1, "kid": 1, "s2": 2, "extract": 1},
    "during": {"cot": 1, "s1": 1, "kid": 2, "s2": 1, "extract": 1},
    "rlm": {"route": 2},
}
GATED = {"after": "s2", "during": "kid", "rlm": "route"}


@dataclass(frozen=True)
class Case:
    kind: str
    n: int

    def key(self, name: str) -> str:
        return f"{self.kind}{self.n}:{name}"


def act(tool: str, args: dict[str, str]) -> str:
    return fields(next_thought="next", next_tool_name=tool, next_tool_args=json.dumps(args))


def script(request: ScriptedRequest) -> Reply:
    """The model's side, by markers: the child RLM's prompt has a `code` output, ReAct's
    steps a `next_tool_name`, CoT a `needs_tools`; what is left is ReAct's extract."""
    text = request.prompt_text
    if "[[ ## code ## ]]" in text:
        kid = re.search(r"(KIDQ|CHATTASK) (\w+) (\d+)", text)
        assert kid, text[-300:]
        case = Case(kid.group(2), int(kid.group(3)))
        reply = step("SUBMIT(answer='KIDANSWER-' + str(6 * 7))")
        return _gated(case, "kid" if kid.group(1) == "KIDQ" else "route", reply)
    root = re.search(r"CHATTASK (\w+) (\d+)", text)
    assert root, text[-300:]
    case = Case(root.group(1), int(root.group(2)))
    if "next_tool_name" in text:
        if ANSWER not in text:
            return _gated(case, "s1", act("rlm_query", {"query": f"KIDQ {case.kind} {case.n}"}))
        return _gated(case, "s2", act("finish", {}))
    if "needs_tools" in text:
        return _gated(case, "cot", fields(reasoning="a tool", answer="", needs_tools="True"))
    found = re.search(r"KIDANSWER-\d+", text)  # the tool's result, as the trajectory holds it
    return _gated(case, "extract", fields(reasoning="read it", answer=found[0] if found else "?"))


def _gated(case: Case, name: str, text: str) -> Reply:
    gate = case.key("gate") if GATED[case.kind] == name else None
    return Reply(text, key=case.key(name), gate=gate)


async def run_rounds(processes: Processes, fake: ScriptedLM, kind: str) -> list[float]:
    """`KILLS` rounds, each in a session of its own (no history from the last round): ask,
    wait at the gate, SIGKILL the holder, release, check, start the killed replica again."""
    times = []
    for n in range(KILLS):
        async with session(processes) as s:
            await s.use_model(fake)
            times.append(await one_round(processes, s, fake, Case(kind, n)))
    return times


async def one_round(processes: Processes, s: Session, fake: ScriptedLM, case: Case) -> float:
    names = agents(processes)
    gate = fake.gate(case.key("gate"))  # made before the call, or the call does not wait
    turn = new_id()
    mode = "rlm_only" if case.kind == "rlm" else "auto"
    message = f"CHATTASK {case.kind} {case.n}: what does the tool say?"
    await s.append(turn, TurnRequested(message=message, mode=mode))
    await eventually(lambda: gate.arrivals >= 1, timeout=90, what=f"{case} at its gate")
    name = await holder(s, turn)
    names[name].kill()
    killed_at = time.monotonic()
    gate.release()
    took = await next_step_after(s, turn, killed_at)
    try:
        ended = await s.ended(turn, timeout=120)
    except WaitTimeout as exc:
        raise AssertionError(f"{case}: {await where(s, turn)}") from exc
    assert isinstance(ended, TurnCompleted), (case, ended, names[name].logs()[-3000:])
    assert ended.answer == ANSWER, (case, ended.answer)
    await check_round(s, fake, case, turn)
    names[name].restart()
    return took


def no_step_twice(case: Case, name: str, events: list[Event]) -> None:
    keys = [k for k in map(step_key, events) if k is not None]
    doubled = [k for k, c in Counter(keys).items() if c > 1]
    assert not doubled, (case, name, doubled)
    assert len(of_type(events, RunStarted)) == 1, (case, name)
    assert isinstance(events[-1], TERMINAL), (case, name, events[-1])


async def check_round(s: Session, fake: ScriptedLM, case: Case, turn: str) -> None:
    log = [e for e in await s.read(log_subject(s.tenant, s.session)) if e.turn == turn]
    assert len([e for e in log if isinstance(e.data, TERMINAL_TURN)]) == 1, case
    attempts = [e.data.attempt for e in log if isinstance(e.data, TurnStarted)]
    assert attempts[:2] == [1, 2], (case, attempts)
    assert attempts == sorted(set(attempts)), (case, attempts)
    root = await s.run_events(turn)
    no_step_twice(case, "root", root)
    assert isinstance(root[-1], RunCompleted)
    resumed = of_type(root, RunResumed)[0]  # a second when a loaded holder was fenced too
    mine = {k: c for k, c in fake.calls.items() if k.startswith(f"{case.kind}{case.n}:")}
    assert mine == {case.key(k): c for k, c in EXPECTED[case.kind].items()}, (case, mine)
    if case.kind == "rlm":
        assert root[-1].outputs == {"module": "rlm"}
        assert [(e.from_module, e.to_module) for e in of_type(root, Escalated)] == [("cot", "rlm")]
        assert resumed.in_flight.startswith("the RLM route's run"), resumed
        assert not of_type(root, ToolCalled)
        (route,) = of_type(root, ChildRunRequested)
        kid = await s.events_of(route.child_run)
        no_step_twice(case, "route", kid)
        assert of_type(kid, RunResumed), (case, "the route's run was not resumed from its record")
        return
    assert root[-1].outputs == {"module": "react"}
    assert [(e.from_module, e.to_module) for e in of_type(root, Escalated)] == [("cot", "react")]
    called = of_type(root, ToolCalled)
    assert [c.tool for c in called] == ["rlm_query"], (case, called)
    assert [r.call_id for r in of_type(root, ToolReturned)] == [called[0].call_id]
    (child,) = of_type(root, ChildRunRequested)  # the same child run, not a second one
    kid = await s.events_of(child.child_run)
    no_step_twice(case, "child", kid)
    if case.kind == "after":
        assert resumed.in_flight.startswith("the next react model call"), resumed
        assert root.index(of_type(root, ToolReturned)[0]) < root.index(resumed)
        assert not of_type(kid, RunResumed)  # the child had ended: it is not run again
    else:
        assert resumed.in_flight == f"tool call {called[0].call_id} (rlm_query, no result recorded)"
        assert (
            root.index(called[0]) < root.index(resumed) < root.index(of_type(root, ToolReturned)[0])
        )
        assert of_type(kid, RunResumed), (case, "the child run was not resumed from its record")


async def test_a_kill_after_a_react_tool_returned_repeats_only_the_next_step_call(
    processes: Processes,
) -> None:
    with ScriptedLM(script) as fake:
        times = await run_rounds(processes, fake, "after")
    print(f"{len(times)} kills, kill -> next stored step: max {max(times):.2f}s")


async def test_a_kill_during_a_react_tool_call_runs_that_call_again_and_resumes_its_child(
    processes: Processes,
) -> None:
    with ScriptedLM(script) as fake:
        times = await run_rounds(processes, fake, "during")
    print(f"{len(times)} kills, kill -> next stored step: max {max(times):.2f}s")


async def test_a_kill_in_the_rlm_route_resumes_the_routes_run_without_escalating_again(
    processes: Processes,
) -> None:
    with ScriptedLM(script) as fake:
        times = await run_rounds(processes, fake, "rlm")
    print(f"{len(times)} kills, kill -> next stored step: max {max(times):.2f}s")
