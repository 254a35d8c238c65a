"""The root RLM's answer streams too: when dspy's extract step writes the answer (the run used
its iterations without `SUBMIT`), that reply's `answer` field goes to the session's live subject
as `assistant_token` deltas while it is generated, and a watching socket sees them before the
stored events. The scripted LM is a FAKE model server; the rest is the real mesh."""

from pathlib import Path
from typing import Any

import pytest

from fleet_agent.lm import ANSWER_DELTA
from fleet_events.run import LlmCalled
from fleet_harness.scripted_lm import ScriptedLM

from ..agent.rlm_kit import Processes, fields, of_type, processes, session, step
from ..gateway.ws_kit import frames_until, serve

__all__ = ["processes"]

pytestmark = pytest.mark.slow

AGENT_ENV = {
    "FLEET_AGENT_RUNNER": "rlm",
    "FLEET_AGENT_TURN_SLOTS": "1",
    "FLEET_ENGINE_MAX_ITERS": "1",
}
ANSWER = "The total is 42, counted twice over [to be sure]."


def kind(frame: dict[str, Any]) -> str:
    if frame["type"] == "event":
        return str(frame["event"]["data"]["type"])
    return str(frame["type"])


async def test_an_rlm_out_of_iterations_streams_no_guessed_answer_and_fails_no_submit(
    processes: Processes, tmp_path: Path
) -> None:
    # dspy's extract step, at the last iteration without SUBMIT, made up the answer and it was
    # streamed to the socket as the turn's answer; it is no longer asked (issue 20 item 1)
    extracted = fields(reasoning="the cell counted", answer=ANSWER)
    with ScriptedLM([step("total = 6 * 7\nprint(total)"), extracted]) as fake:
        async with session(processes) as s, serve(processes.server.url, tmp_path / "gw") as gw:
            await s.use_model(fake)
            ws = await gw.socket(
                s.tenant, "/api/v1/ws/execution/events", session_id=s.session, after_seq=0
            )
            turn = await s.ask("What is six times seven?")
            frames = await frames_until(
                ws, lambda got: any(kind(f) == "turn.failed" for f in got), timeout=90
            )
            await ws.close()
            events = await s.run_events(turn)
            asked = sum(fake.calls.values())
    answer_deltas = [f for f in frames if f["type"] == "delta" and f["kind"] == ANSWER_DELTA]
    assert answer_deltas == []
    (failed,) = [f for f in frames if kind(f) == "turn.failed"]
    assert failed["event"]["data"]["code"] == "no_submit"
    assert asked == 1  # the one step; the extract call was never made
    assert len(of_type(events, LlmCalled)) == 1
