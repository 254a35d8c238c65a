"""An RLM turn's cell output goes live while the cell runs, and exactly once: the cell prints,
then waits in an `llm_query` held at a gate of the scripted LM (a FAKE model server) until the
test has heard that print on `fleet.live.<tenant>.<session>`; after the gate the cell prints
again and submits. The `cell_output` deltas of the run, joined, are the cell's recorded
stdout: the streamed part is not sent again when the cell ends. Real broker, budget and agent
processes, real sandboxes."""

import msgspec
import pytest
from nats.aio.msg import Msg

from fleet_agent.engine import root_run_id
from fleet_events.bus import LiveDelta
from fleet_events.run import CellExecuted
from fleet_events.session import TurnCompleted
from fleet_events.subjects import live
from fleet_harness.scripted_lm import Reply, ScriptedLM, ScriptedRequest
from fleet_harness.waits import eventually

from .rlm_kit import Processes, of_type, processes, session, step

__all__ = ["processes"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

AGENT_ENV = {"FLEET_AGENT_TURN_SLOTS": "1", "FLEET_ENGINE_MAX_ITERS": "3"}
CELL = "print('first')\nx = llm_query('HELD until heard')\nprint('second', x)"


def script(request: ScriptedRequest) -> Reply:
    if request.last_user.startswith("HELD"):
        return Reply("ok", key="held", gate="held")
    if "second ok" in request.prompt_text:
        return Reply(step("SUBMIT(answer='done')"), key="submit")
    return Reply(step(CELL), key="cell")


async def test_a_cells_output_is_live_while_it_runs_and_sent_once(processes: Processes) -> None:
    deltas: list[LiveDelta] = []
    decode = msgspec.json.Decoder(LiveDelta).decode
    with ScriptedLM(script) as fake:
        held = fake.gate("held")
        async with session(processes) as s:
            await s.use_model(fake)

            async def on_delta(msg: Msg) -> None:
                deltas.append(decode(msg.data))

            await s.nc.subscribe(live(s.tenant, s.session), cb=on_delta)
            await s.nc.flush()
            turn = await s.ask("print, wait, print")
            run = root_run_id(s.tenant, s.session, turn)

            def heard() -> bool:
                text = "".join(d.text for d in deltas if d.kind == "cell_output" and d.run == run)
                return "first" in text

            await eventually(lambda: held.arrivals > 0, timeout=60, what="the llm_query held")
            await eventually(heard, timeout=30, what="the first print heard while the cell waits")
            assert fake.calls["submit"] == 0  # the cell has not ended: it waits at the gate
            held.release()
            ended = await s.ended(turn)
            events = await s.run_events(turn)
            (cell,) = [c for c in of_type(events, CellExecuted) if c.code.startswith("print")]

            def joined() -> str:
                return "".join(d.text for d in deltas if d.kind == "cell_output" and d.run == run)

            # every delta was published before the cell's record, so before the turn ended:
            # by now they are all at this connection, at most still queued for the callback
            await eventually(lambda: joined() == cell.stdout, timeout=10, what="every delta")
            streamed = joined()
    assert isinstance(ended, TurnCompleted), ended
    assert cell.stdout == "first\nsecond ok\n"
    assert streamed == cell.stdout  # every character once: the streamed part and the rest
