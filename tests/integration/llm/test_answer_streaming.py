"""The answer streams to a watching client: a chat turn through the mesh (an agent replica with
the chat runner, a real budget and sandbox broker, the scripted LM — a FAKE model server —
streaming its reply) and a gateway replica, whose WebSocket forwards the agent's deltas from
`fleet.live.<tenant>.<session>` before the stored events that hold the whole answer."""

import json
from pathlib import Path
from typing import Any

import pytest

from fleet_agent.engine import root_run_id
from fleet_agent.lm import ANSWER_DELTA
from fleet_events.bus import CALL_STARTED_DELTA
from fleet_events.run import LlmCalled
from fleet_harness.scripted_lm import ScriptedLM

from ..agent.rlm_kit import Processes, fields, of_type, processes, session
from ..gateway.ws_kit import frames_until, serve

__all__ = ["processes"]

pytestmark = pytest.mark.slow

AGENT_ENV = {"FLEET_AGENT_RUNNER": "chat", "FLEET_AGENT_TURN_SLOTS": "1"}
ANSWER = "Four. Two plus two is four, in any base above four [as usual]."


def kind(frame: dict[str, Any]) -> str:
    if frame["type"] == "event":
        return str(frame["event"]["data"]["type"])
    return str(frame["type"])


async def test_a_chat_turns_answer_reaches_the_socket_as_deltas_before_its_events(
    processes: Processes, tmp_path: Path
) -> None:

    reply = fields(reasoning="simple arithmetic", answer=ANSWER, needs_tools=False)
    with ScriptedLM([reply]) as fake:
        async with session(processes) as s, serve(processes.server.url, tmp_path / "gw") as gw:
            await s.use_model(fake)
            ws = await gw.socket(
                s.tenant, "/api/v1/ws/execution/events", session_id=s.session, after_seq=0
            )
            turn = await s.ask("What is two plus two?")
            frames = await frames_until(
                ws, lambda got: any(kind(f) == "turn.completed" for f in got), timeout=60
            )
            await ws.close()
            events = await s.run_events(turn)
    (started,) = [f for f in frames if f["type"] == "delta" and f["kind"] == CALL_STARTED_DELTA]
    deltas = [f for f in frames if f["type"] == "delta" and f is not started]
    assert deltas, [kind(f) for f in frames]
    assert {d["kind"] for d in deltas} == {ANSWER_DELTA}
    assert frames.index(started) < frames.index(deltas[0])  # the call is in flight first
    assert "".join(d["text"] for d in deltas) == ANSWER
    assert len(deltas) > 3  # as the tokens came, not in one piece
    order = [kind(f) for f in frames]
    assert order.index("delta") < order.index("run.llm_called")  # the preview comes first...
    (called,) = of_type(events, LlmCalled)
    assert called.response == reply  # ...and the stored call holds the whole reply
    assert json.loads(started["text"])["grant"] == called.grant_id  # ...and ends the one in flight
    assert started["run"] == root_run_id(s.tenant, s.session, turn)
    completed = next(f for f in frames if kind(f) == "turn.completed")
    assert json.dumps(completed["event"]["data"]["answer"]) == json.dumps(ANSWER)
