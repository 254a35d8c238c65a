"""A frozen holder, thawed after its turn was resumed elsewhere (issue 16): SIGSTOP instead of
SIGKILL at the "before a step" barrier (the root's second step call waits at the scripted LM's
gate, a FAKE model server). The other replica takes the work item over past the ack deadline,
appends `run.resumed` and ends the turn. Thawed, the frozen replica gets its model answer and
tries to record it: the run subject's head moved, so the append is refused (`RunFenced`), and
its worker finds the turn no longer its attempt (`Superseded`): nothing of the thawed replica
lands on the run subject or the log after the takeover."""

import os
import signal

import pytest

from fleet_agent.engine import root_run_id
from fleet_events.run import RunResumed
from fleet_events.session import TurnCompleted, TurnFailed, log_subject, run_subject
from fleet_harness.scripted_lm import ScriptedLM
from fleet_harness.waits import eventually

from .resume_kit import AGENT_ENV, Case, agents, gate_reached, holder, reach_barrier, script
from .rlm_kit import Processes, processes, session

__all__ = ["AGENT_ENV", "processes"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
AGENTS = 2


async def test_a_thawed_holder_s_next_append_is_refused_and_it_records_nothing(
    processes: Processes,
) -> None:
    names = agents(processes)
    with ScriptedLM(script) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            case = Case("step", 0)
            gate = fake.gate(case.key("gate"))
            turn = await s.ask(case.message)
            await reach_barrier(gate_reached(fake), case, turn)
            frozen = names[await holder(s, turn)]
            os.killpg(frozen.pid, signal.SIGSTOP)
            try:
                gate.release()
                ended = await s.ended(turn, timeout=90)
            finally:
                os.killpg(frozen.pid, signal.SIGCONT)
            assert isinstance(ended, TurnCompleted), ended
            assert ended.answer == "42"

            def refused() -> bool:
                logs = frozen.logs()
                return "appended to by another holder" in logs and "turn superseded" in logs

            await eventually(refused, timeout=60, what="the thawed replica to find itself fenced")
            run = root_run_id(s.tenant, s.session, turn)
            envelopes = await s.read(run_subject(s.tenant, s.session, run))
            log = await s.read(log_subject(s.tenant, s.session))
    frozen_name = frozen.env["FLEET_REPLICA"]
    kinds = [type(e.data) for e in envelopes]
    assert RunResumed in kinds
    after = envelopes[kinds.index(RunResumed) :]
    assert after[0].actor.replica != frozen_name
    assert all(e.actor.replica != frozen_name for e in after), [
        (type(e.data).__name__, e.actor.replica) for e in after
    ]
    ends = [e for e in log if e.turn == turn and isinstance(e.data, TurnCompleted)]
    assert len(ends) == 1
    assert ends[0].actor.replica != frozen_name
    assert not [e for e in log if e.turn == turn and isinstance(e.data, TurnFailed)]
