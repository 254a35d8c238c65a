"""Where a resume is impossible (issue 16): a replica SIGKILLed while its turn's root waits on
children (the children reached by a barrier: both have planned their sleeping cell), and the
session's sandbox deleted while nobody holds the turn, so the REPL state the recorded cells
made is gone. Two agent replicas; the survivor takes the turn's work item over after the 2 s
ack deadline, finds the session's sandbox replaced, and ends the run `run.failed`
(`sandbox_lost`) and the turn `TurnFailed(retryable=True, code="sandbox_lost")`, exactly once.
Every child ends (cancelled by the turn's end, or with its sandbox) and every child sandbox is
deleted. (A kill whose sandbox survives resumes the turn: test_resume_children.py.)"""

import contextlib
import re

import pytest
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from fleet_events import bus, new_id
from fleet_events.bus import Ping
from fleet_events.run import TERMINAL, ChildRunRequested, IterationPlanned, RunFailed, RunStarted
from fleet_events.sandbox import ChildIsolationDecided, DeleteSandbox, SandboxDeleted
from fleet_events.session import TurnCancelled, TurnCompleted, TurnFailed, TurnStarted
from fleet_harness.scripted_lm import Reply, ScriptedLM, ScriptedRequest
from fleet_harness.waits import eventually
from fleet_mesh import rpc

from .rlm_kit import Processes, of_type, processes, session, step

__all__ = ["processes"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

AGENTS = 2
AGENT_ENV = {
    "FLEET_AGENT_TURN_SLOTS": "1",
    "FLEET_AGENT_ACK_WAIT_S": "2",  # 1 s was seen to take a loaded live holder's turn over
    "FLEET_ENGINE_ACK_WAIT_S": "2",
    "FLEET_ENGINE_CHILD_SLOTS": "2",
    "FLEET_ENGINE_MAX_ITERS": "3",
}


def script(request: ScriptedRequest) -> Reply:
    text = request.prompt_text
    if "ROOT" in text:
        fan = "answers = sub_rlm_batched(['child task alpha', 'child task beta'])"
        return Reply(step(fan), key="root")
    name = re.search(r"child task (alpha|beta)", text)
    assert name, "a request from neither the root nor a child"
    return Reply(step("import time\ntime.sleep(300)\nSUBMIT(answer='late')"), key=name.group(1))


async def test_a_kill_with_the_sandbox_gone_fails_the_turn_once_and_reaps_the_children(
    processes: Processes,
) -> None:
    agents = [r for r in processes.replicas if r.service == "agent"]
    names = {r.env["FLEET_REPLICA"]: r for r in agents}
    with ScriptedLM(script) as fake:
        async with session(processes) as s:
            seen: set[str] = set()

            async def both_up() -> bool:
                with contextlib.suppress(NatsTimeout, NoRespondersError, TimeoutError):
                    pong = await rpc.call_verb(s.nc, bus.ping("agent"), Ping(), timeout=0.5)
                    seen.add(pong.replica)
                return set(names) <= seen

            await eventually(both_up, timeout=30, interval=0.0, what="both agent replicas")
            await s.use_model(fake)
            turn = await s.ask("ROOT: wait on two sleepers")

            async def both_planned() -> list[str] | None:
                requested = of_type(await s.run_events(turn), ChildRunRequested)
                if len(requested) < 2:
                    return None
                for r in requested:
                    if not of_type(await s.events_of(r.child_run), IterationPlanned):
                        return None
                return [r.child_run for r in requested]

            children = await eventually(both_planned, timeout=60, what="both children to plan")
            (started,) = [e for e in await s.log() if isinstance(e, TurnStarted)]
            names[started.replica].kill()
            (root_started,) = of_type(await s.run_events(turn), RunStarted)
            session_sandbox = root_started.sandbox

            async def deleted() -> bool:
                # the broker answers a retryable error now and then (it says so): ask again
                if of_type(await s.sandbox_events(session_sandbox), SandboxDeleted):
                    return True
                gone = DeleteSandbox(request_id=new_id(), tenant=s.tenant, sandbox=session_sandbox)
                await rpc.call_verb(
                    s.nc, bus.DELETE_SANDBOX, gone, target=session_sandbox, timeout=30
                )
                return True

            await eventually(deleted, timeout=60, what="the session's sandbox to be deleted")
            ended = await s.ended(turn, timeout=120)

            async def children_ended() -> bool:
                for child in children:
                    if not isinstance((await s.events_of(child))[-1], TERMINAL):
                        return False
                return True

            await eventually(children_ended, timeout=90, what="every child run to end")
            root_end = (await s.run_events(turn))[-1]
            decided = of_type(await s.sandbox_events(root_started.sandbox), ChildIsolationDecided)

            async def all_deleted() -> bool:
                for d in decided:
                    assert d.child is not None
                    if not of_type(await s.sandbox_events(d.child), SandboxDeleted):
                        return False
                return True

            await eventually(all_deleted, timeout=60, what="every child sandbox to be deleted")
            log = await s.log()
    assert isinstance(ended, TurnFailed), ended
    assert (ended.retryable, ended.code) == (True, "sandbox_lost")
    assert isinstance(root_end, RunFailed)
    assert (root_end.reason, root_end.retryable) == ("sandbox_lost", True)
    ends = [e for e in log if isinstance(e, TurnCompleted | TurnFailed | TurnCancelled)]
    assert len(ends) == 1
    assert len(decided) == 2
    assert fake.calls == {"root": 1, "alpha": 1, "beta": 1}  # nothing asked twice
