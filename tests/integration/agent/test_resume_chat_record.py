"""Issue 29 item 2, for the chat runner: a chat run taken over from a holder SIGKILLed mid-turn
repeats nothing its record holds. Model calls are counted at the scripted LM (a FAKE model
server, per script key); session facts on the log.

- "code": the code route's first cell failed and its second model call waits at the gate when
  the holder dies. The takeover runs the route again from its first attempt: the first
  `ComputeTurn` call is answered from the record (the fake sees it once), the first cell's
  result too (one `execute_code` call per id on the record); only the call in flight is asked
  again. `run.completed` counts each of the run's two model calls once.
- "ask": ReAct's `ask_user` waits in the turn (parking off) when the holder dies. The takeover
  runs the call in flight again under its id, finds the question it stored and waits for the
  answer to that one: the log holds the question once, and the user's answer to it reaches
  the turn. (Before, the redelivered attempt took it for a parked turn and answered "the user
  did not answer".)
"""

import json
import re
from collections import Counter

import pytest

from fleet_events import Event, new_id
from fleet_events.journal import step_key
from fleet_events.run import RunCompleted, RunResumed, ToolCalled, ToolReturned
from fleet_events.session import (
    InputProvided,
    InputRequested,
    TurnCompleted,
    TurnRequested,
    log_subject,
)
from fleet_harness.scripted_lm import Reply, ScriptedLM, ScriptedRequest
from fleet_harness.waits import WaitTimeout, eventually

from .resume_kit import agents, holder, where
from .rlm_kit import Processes, Session, fields, of_type, processes, session

__all__ = ["processes"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
AGENTS = 2
AGENT_ENV = {
    "FLEET_AGENT_RUNNER": "chat",
    "FLEET_AGENT_TURN_SLOTS": "2",
    "FLEET_AGENT_ACK_WAIT_S": "2",  # as resume_kit: a live holder is not taken over on load
    "FLEET_ENGINE_ACK_WAIT_S": "2",
    "FLEET_CHAT_PARK": "false",  # ask_user waits in the turn: the kill lands in the wait
}
COLOUR = "BLUE-7"


def script(request: ScriptedRequest) -> Reply:
    text = request.prompt_text
    marker = re.search(r"CHATTASK (\w+) (\d+)", text)
    assert marker, text[-300:]
    key = f"{marker.group(1)}{marker.group(2)}"
    if "[[ ## previous_error ## ]]" in text:  # the code route's ComputeTurn
        if "FIRSTFAIL" not in text:
            return Reply("[[ ## code ## ]]\nraise ValueError('FIRSTFAIL')", key=f"{key}:code1")
        return Reply("[[ ## code ## ]]\nprint(17 * 23)", key=f"{key}:code2", gate=f"{key}:gate")
    if "next_tool_name" in text:
        if COLOUR not in text:
            args = json.dumps({"question": "Which colour?"})
            step = fields(next_thought="ask", next_tool_name="ask_user", next_tool_args=args)
            return Reply(step, key=f"{key}:s1")
        step = fields(next_thought="done", next_tool_name="finish", next_tool_args="{}")
        return Reply(step, key=f"{key}:s2")
    if "needs_tools" in text:
        return Reply(fields(reasoning="ask", answer="", needs_tools="True"), key=f"{key}:cot")
    found = COLOUR if COLOUR in text else "?"
    return Reply(fields(reasoning="read it", answer=found), key=f"{key}:extract")


def mine(fake: ScriptedLM, key: str) -> dict[str, int]:
    return {k.split(":", 1)[1]: c for k, c in fake.calls.items() if k.startswith(f"{key}:")}


def no_step_twice(events: list[Event]) -> None:
    keys = [k for k in map(step_key, events) if k is not None]
    assert not [k for k, c in Counter(keys).items() if c > 1], keys


async def ended(s: Session, turn: str) -> Event:
    try:
        return await s.ended(turn, timeout=120)
    except WaitTimeout as exc:
        raise AssertionError(await where(s, turn)) from exc


async def test_a_takeover_of_the_code_route_asks_no_recorded_call_and_runs_no_recorded_cell(
    processes: Processes,
) -> None:
    with ScriptedLM(script) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            gate = fake.gate("code0:gate")
            turn = new_id()
            await s.append(turn, TurnRequested(message="CHATTASK code 0: what is 17 * 23?"))
            await eventually(lambda: gate.arrivals >= 1, timeout=90, what="the second call")
            names = agents(processes)
            name = await holder(s, turn)
            names[name].kill()
            gate.release()
            done = await ended(s, turn)
            names[name].restart()
            assert isinstance(done, TurnCompleted), done
            assert done.answer.startswith("391\n"), done.answer
            assert mine(fake, "code0") == {"code1": 1, "code2": 2}, dict(fake.calls)
            root = await s.run_events(turn)
            no_step_twice(root)
            (resumed,) = of_type(root, RunResumed)
            assert resumed.in_flight.startswith("the next code model call"), resumed
            calls = of_type(root, ToolCalled)
            assert [c.call_id.rsplit("-", 1)[1] for c in calls] == ["t1", "t2"], calls
            returned = of_type(root, ToolReturned)
            assert [r.call_id for r in returned] == [c.call_id for c in calls]
            assert "FIRSTFAIL" in returned[0].error
            assert returned[1].result.strip() == "391"
            assert root.index(returned[0]) < root.index(resumed) < root.index(calls[1])
            end = root[-1]
            assert isinstance(end, RunCompleted)
            assert end.llm_calls == 2, end


async def test_a_takeover_during_ask_user_waits_for_the_answer_to_the_question_it_stored(
    processes: Processes,
) -> None:
    with ScriptedLM(script) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            turn = new_id()
            await s.append(turn, TurnRequested(message="CHATTASK ask 0: which colour do I like?"))

            async def questions() -> list[InputRequested]:
                log = await s.read(log_subject(s.tenant, s.session))
                ours = [e for e in log if e.turn == turn]
                return [e.data for e in ours if isinstance(e.data, InputRequested)]

            (asked,) = await eventually(questions, timeout=90, what="the question on the log")
            names = agents(processes)
            name = await holder(s, turn)
            names[name].kill()

            async def resumed() -> bool:
                return bool(of_type(await s.run_events(turn), RunResumed))

            await eventually(resumed, timeout=60, what="the takeover")
            await s.append(turn, InputProvided(request_id=asked.request_id, answer=COLOUR))
            done = await ended(s, turn)
            names[name].restart()
            assert isinstance(done, TurnCompleted), done
            assert done.answer == COLOUR, done.answer
            assert await questions() == [asked]  # asked once, not again by the takeover
            assert mine(fake, "ask0") == {"cot": 1, "s1": 1, "s2": 1, "extract": 1}
            root = await s.run_events(turn)
            no_step_twice(root)
            (taken,) = of_type(root, RunResumed)
            (call,) = of_type(root, ToolCalled)
            assert taken.in_flight == f"tool call {call.call_id} (ask_user, no result recorded)"
            (result,) = of_type(root, ToolReturned)
            assert result.result == COLOUR, result
