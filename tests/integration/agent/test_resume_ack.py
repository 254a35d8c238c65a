"""Crash point "after TurnCompleted, before the ack" (issue 16): the worker's before-ack
barrier (`FLEET_AGENT_HOLD_BEFORE_ACK`, tests only) holds the turn's work item after its end
is stored; the holder is SIGKILLed there. The redelivery finds the end stored and acks: nothing
runs again (the fake sees the one step once), nothing is recorded twice, and no delivery is left
pending. Ten kills, one mesh (resume_kit)."""

import tempfile
from pathlib import Path

import pytest

from fleet_events import streams
from fleet_events.session import TurnStarted
from fleet_harness.scripted_lm import ScriptedLM
from fleet_harness.waits import eventually

from .resume_kit import AGENT_ENV as RESUME_ENV
from .resume_kit import KILLS, ended_barrier, run_rounds, script
from .rlm_kit import Processes, processes, session

__all__ = ["processes"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
AGENTS = 2
BARRIERS = Path(tempfile.mkdtemp(prefix="fleet-resume-ack-"))
AGENT_ENV = {
    **RESUME_ENV,
    "FLEET_AGENT_HOLD_BEFORE_ACK": "1",
    "FLEET_AGENT_BARRIER_DIR": str(BARRIERS),
}


async def test_a_kill_after_the_end_before_the_ack_repeats_nothing(processes: Processes) -> None:
    with ScriptedLM(script) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            rounds = await run_rounds(processes, s, fake, "ack", ended_barrier(BARRIERS))
            js = s.nc.jetstream()

            async def nothing_pending() -> bool:
                info = await js.consumer_info(streams.WORK.name, streams.TURN_WORKERS.durable)
                return bool(info.num_ack_pending == 0 and info.num_pending == 0)

            await eventually(nothing_pending, timeout=30, what="every turn's work item acked")
            log = await s.log()
    assert len(rounds) == KILLS
    assert len([e for e in log if isinstance(e, TurnStarted)]) == KILLS  # never a second attempt
