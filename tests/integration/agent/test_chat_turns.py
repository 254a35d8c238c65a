"""Chat turns through the mesh: an agent replica with `FLEET_AGENT_RUNNER=chat`, a real
sandbox broker and budget as processes, real sandboxes, and the scripted LM (a FAKE model
server) writing the model's side. The test appends `TurnRequested` itself (no gateway).

Here the RLM route is the real engine: `rlm_only` hands the turn to a child run in the
session's sandbox, and the chat run records it with the child chain's head.
"""

import pytest

from fleet_agent.engine import root_run_id
from fleet_events import bus
from fleet_events.bus import Ping
from fleet_events.run import (
    ChildRunCompleted,
    Escalated,
    LlmCalled,
    RunCompleted,
    RunStarted,
    ToolReturned,
)
from fleet_events.session import (
    InputProvided,
    InputRequested,
    MemoryFileWritten,
    TurnCompleted,
    TurnParked,
    TurnRequested,
    TurnStarted,
    run_subject,
    session_filter,
)
from fleet_events.session_fold import FOLD, answer_input
from fleet_harness.scripted_lm import ScriptedLM
from fleet_harness.waits import eventually
from fleet_mesh import rpc
from fleet_mesh.store import EMPTY

from .rlm_kit import Processes, fields, of_type, processes, session, step

__all__ = ["processes"]

pytestmark = pytest.mark.slow

AGENT_ENV = {
    "FLEET_AGENT_RUNNER": "chat",
    "FLEET_AGENT_TURN_SLOTS": "2",
    "FLEET_ENGINE_MAX_ITERS": "4",
    "FLEET_ENGINE_MAX_LLM_CALLS": "5",
}


def act(tool: str, args: str = "{}") -> str:
    return fields(next_thought="next", next_tool_name=tool, next_tool_args=args)


async def test_a_chat_turn_appended_to_the_log_completes_with_every_step(
    processes: Processes,
) -> None:
    with ScriptedLM([fields(reasoning="easy", answer="four", needs_tools=False)]) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            turn = await s.ask("What is two plus two?")
            ended = await s.ended(turn)
            events = await s.run_events(turn)
            run = root_run_id(s.tenant, s.session, turn)
            head = await s.store.head(run_subject(s.tenant, s.session, run))
    assert isinstance(ended, TurnCompleted), ended
    assert ended.answer == "four"
    assert isinstance(events[0], RunStarted)
    assert events[0].kind == "chat"
    assert isinstance(events[-1], RunCompleted)
    assert len(of_type(events, LlmCalled)) == 1
    assert head != EMPTY
    assert ended.root_head_hash == head.hash  # the turn ties in the chat run's chain


async def test_rlm_only_runs_the_real_engine_as_a_child_run(processes: Processes) -> None:
    script = [step("SUBMIT(answer=str(sum(range(5))))", reasoning="add them up")]
    with ScriptedLM(script) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            turn = "t" + s.session[:20]
            await s.append(turn, TurnRequested(message="add 0..4", mode="rlm_only"))
            ended = await s.ended(turn)
            events = await s.run_events(turn)
            (done,) = of_type(events, ChildRunCompleted)
            child_head = await s.store.head(run_subject(s.tenant, s.session, done.child_run))
            child = [e.data for e in await s.read(run_subject(s.tenant, s.session, done.child_run))]
    assert isinstance(ended, TurnCompleted), ended
    assert ended.answer == "10"
    (up,) = of_type(events, Escalated)
    assert (up.to_module, up.rule) == ("rlm", "rlm_only")
    assert done.answer == "10"
    assert done.child_head_hash == child_head.hash
    assert isinstance(child[0], RunStarted)
    assert (child[0].kind, child[0].depth) == ("rlm", 1)


async def test_memory_files_and_code_run_in_the_sessions_sandbox(processes: Processes) -> None:
    script = [
        act("memory_write", '{"path": "notes/plan.md", "content": "ship on friday"}'),
        act("execute_code", '{"code": "print(open(\'memory/notes/plan.md\').read().upper())"}'),
        act("finish"),
        fields(reasoning="read it back", answer="SHIP ON FRIDAY"),
    ]
    with ScriptedLM(script) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            turn = await s.ask("Write the plan to a memory file and run code to read it")
            ended = await s.ended(turn)
            events = await s.run_events(turn)
            log = await s.log()
    assert isinstance(ended, TurnCompleted), ended
    (written,) = of_type(log, MemoryFileWritten)
    assert (written.file.path, written.file.size) == ("notes/plan.md", len("ship on friday"))
    ran = [r for r in of_type(events, ToolReturned) if r.tool == "execute_code"]
    assert ran[0].error == ""
    assert ran[0].result.strip() == "SHIP ON FRIDAY"


async def test_a_question_parks_the_turn_holding_no_worker_and_the_answer_resumes_it(
    processes: Processes,
) -> None:
    script = [
        act("ask_user", '{"question": "Which region?", "options": ["eu", "us"]}'),
        act("finish"),
        fields(reasoning="the user chose", answer="deploying to eu"),
    ]
    with ScriptedLM(script) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            turn = await s.ask("Deploy the code to production")

            async def parked() -> TurnParked | None:
                return next(iter(of_type(await s.log(), TurnParked)), None)

            park = await eventually(parked, timeout=60, what="the turn to park")

            async def idle() -> bool:
                pong = await rpc.call_verb(s.nc, bus.ping("agent"), Ping(), timeout=2)
                return bool(pong.details["turns_running"] == 0)

            await eventually(idle, timeout=30, what="the replica to hold no turn")
            assert len(fake.requests) == 1  # nothing runs while the user thinks
            (asked,) = of_type(await s.log(), InputRequested)
            assert park.request_id == asked.request_id
            state = (await s.store.load(session_filter(s.tenant, s.session), FOLD)).state
            answer = answer_input(state, asked.request_id, "eu please", option="eu")
            assert isinstance(answer, InputProvided)
            await s.append(None, answer)
            ended = await s.ended(turn)
            events = await s.run_events(turn)
            log = await s.log()
    assert isinstance(ended, TurnCompleted), ended
    assert ended.answer == "deploying to eu"
    assert [e.attempt for e in of_type(log, TurnStarted)] == [1, 2]
    assert park.attempt == 1
    returned = [r for r in of_type(events, ToolReturned) if r.tool == "ask_user"]
    assert [r.result for r in returned] == ["eu please (option: eu)"]
    # the resumed attempt asked the model only for the steps after the question
    assert len(fake.requests) == len(script)
    assert "eu please" in fake.requests[1].prompt_text
    calls = of_type(events, LlmCalled)
    assert [c.index for c in calls] == [1, 2, 3]
    assert len({c.grant_id for c in calls}) == 3
    assert isinstance(events[-1], RunCompleted)
    assert len(of_type(events, RunStarted)) == 1  # one run, carried on


async def test_workspace_file_tools_go_through_the_broker(processes: Processes) -> None:
    script = [
        act("workspace_write", '{"path": "data/b.txt", "content": "beta"}'),
        act("workspace_write", '{"path": "data/a.txt", "content": "alpha"}'),
        act("list_files", '{"path": "data"}'),
        act("workspace_read", '{"path": "data/a.txt"}'),
        act("finish"),
        fields(reasoning="listed and read", answer="alpha"),
    ]
    with ScriptedLM(script) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            turn = await s.ask("Write two files in the sandbox, list them, read one")
            ended = await s.ended(turn)
            events = await s.run_events(turn)
            workspace = await s.workspace()
    assert isinstance(ended, TurnCompleted), ended
    results = {r.tool: r for r in of_type(events, ToolReturned)}
    assert results["list_files"].result == ["data/a.txt", "data/b.txt"]
    assert results["workspace_read"].result == "alpha"
    assert (workspace / "data" / "b.txt").read_text() == "beta"
