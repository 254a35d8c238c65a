"""RLM turns over the mesh: a real broker, budget and agent replica as processes, real
sandboxes, and the scripted LM (a FAKE model server) writing the model's side.

The scripted replies are what dspy's ChatAdapter parses for RLM's action step (`reasoning`,
`code`); `llm_query` and facade sub-agents reach the same fake through the `delegate` role.
"""

import pytest

from fleet_agent.engine import FACADE_RLM_REFUSED
from fleet_events.run import (
    CellExecuted,
    IterationPlanned,
    LlmCalled,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunStarted,
    ToolCalled,
)
from fleet_events.session import (
    CancelRequested,
    SandboxAttached,
    TurnCancelled,
    TurnCompleted,
    TurnFailed,
    session_filter,
)
from fleet_harness.scripted_lm import ScriptedLM
from fleet_harness.waits import eventually

from .rlm_kit import Processes, fields, of_type, processes, session, step

__all__ = ["processes"]

AGENT_ENV = {
    "FLEET_AGENT_TURN_SLOTS": "2",
    "FLEET_ENGINE_MAX_ITERS": "4",
    "FLEET_ENGINE_MAX_LLM_CALLS": "3",
}


async def test_an_rlm_turn_with_llm_query_records_every_step(processes: Processes) -> None:
    script = [
        step("x = llm_query('Say hi to the fleet')\nprint(x)", reasoning="ask the sub model"),
        "hello fleet",
        step("SUBMIT(answer=x.upper())", reasoning="shout it"),
    ]
    with ScriptedLM(script) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            turn = await s.ask("greet the fleet")
            ended = await s.ended(turn)
            events = await s.run_events(turn)
            log = await s.log()
            tree = await s.tree(turn)
            stored = [r.data async for r in s.store.read_raw(session_filter(s.tenant, s.session))]
    assert isinstance(ended, TurnCompleted), ended
    assert ended.answer == "HELLO FLEET"
    # issue 27: the host's sandbox paths are the broker's, never in the session's record
    # (exported and shown to the tenant): the attach named the workspace's host path
    host = str(processes.sandboxes).encode()
    assert [d[:300] for d in stored if host in d] == []
    started, *_, completed = events
    assert isinstance(started, RunStarted)
    assert (started.kind, started.depth, started.task) == ("rlm", 0, "greet the fleet")
    assert isinstance(completed, RunCompleted)
    assert (completed.answer, completed.iterations, completed.llm_calls) == ("HELLO FLEET", 2, 3)
    # the turn ties in the root run's chain head
    assert ended.root_head_hash
    calls = of_type(events, LlmCalled)
    assert [(c.request_kind, c.role, c.index) for c in calls] == [
        ("step", "planner", 1), ("sub", "delegate", 2), ("step", "planner", 3),
    ]  # fmt: skip
    sub_call = calls[1]
    assert sub_call.response == "hello fleet"
    assert sub_call.messages[-1].content == "Say hi to the fleet"
    assert sub_call.cell  # made from inside a cell, and says which
    plans = of_type(events, IterationPlanned)
    assert [(p.index, p.reasoning, p.llm_call) for p in plans] == [
        (0, "ask the sub model", calls[0].call_id), (1, "shout it", calls[2].call_id),
    ]  # fmt: skip
    cells = {c.cell_id: c for c in of_type(events, CellExecuted)}
    asked = cells[sub_call.cell]
    assert (asked.iteration, asked.stdout.strip()) == (0, "hello fleet")
    final = [c for c in cells.values() if c.final is not None]
    assert [c.final for c in final] == [{"answer": "HELLO FLEET"}]
    # the model's own steps are not charged to the tree's sub calls: one llm_query was
    assert (tree.granted, tree.calls_recorded, tree.open) == (1, 3, False)
    attached = of_type(log, SandboxAttached)
    assert len(attached) == 1
    assert attached[0].interpreter.sandbox == started.sandbox
    assert sum(fake.calls.values()) == 3


async def test_a_second_turn_runs_in_the_sessions_sandbox(processes: Processes) -> None:
    """Each run has a REPL context of its own (closed when it ends); the sandbox, and its
    files, are the session's."""
    script = [
        step("open('kept.txt', 'w').write('41')\nSUBMIT(answer='stored')"),
        step("SUBMIT(answer=str(int(open('kept.txt').read()) + 1))"),
    ]
    with ScriptedLM(script) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            first = await s.ended(await s.ask("store something"))
            second = await s.ended(await s.ask("read it back"))
            log = await s.log()
    assert isinstance(first, TurnCompleted)
    assert isinstance(second, TurnCompleted)
    assert second.answer == "42"
    assert len(of_type(log, SandboxAttached)) == 1


async def test_budget_refusal_reaches_sandbox_code_as_an_error_it_can_read(
    processes: Processes,
) -> None:
    """The tree allows 3 sub calls; the fourth llm_query is refused by the budget service
    (not by dspy's own counter) and the cell sees why."""
    code = (
        "seen = []\n"
        "for i in range(4):\n"
        "    try:\n"
        "        seen.append(llm_query(f'q{i}'))\n"
        "    except RuntimeError as exc:\n"
        "        seen.append(str(exc))\n"
        "print(seen[-1])"
    )
    script = [step(code), "a0", "a1", "a2", step("SUBMIT(answer=seen[-1])")]
    with ScriptedLM(script) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            turn = await s.ask("spend it all")
            ended = await s.ended(turn)
            events = await s.run_events(turn)
            tree = await s.tree(turn)
    assert isinstance(ended, TurnCompleted), ended
    assert "budget spent: asked for 1 LLM call(s), 0 of 3 left" in ended.answer
    cell = next(c for c in of_type(events, CellExecuted) if "budget spent" in c.stdout)
    assert cell.iteration == 0
    assert (tree.granted, tree.refusals) == (3, 1)
    assert sum(fake.calls.values()) == 5  # the refused call never reached the model


async def test_a_facade_predict_is_charged_to_the_tree_and_a_facade_rlm_is_refused(
    processes: Processes,
) -> None:
    code = (
        "p = dspy.Predict('question -> answer')(question='Capital of France?')\n"
        "try:\n"
        "    r = dspy.RLM('q -> a')(q='x')\n"
        "except Exception as exc:\n"
        "    r = str(exc)\n"
        "print(p.answer)\n"
        "print(r)"
    )
    script = [step(code), fields(answer="Paris"), step("SUBMIT(answer=p.answer)")]
    with ScriptedLM(script) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            turn = await s.ask("use sub-agents")
            ended = await s.ended(turn)
            events = await s.run_events(turn)
            tree = await s.tree(turn)
    assert isinstance(ended, TurnCompleted), ended
    assert ended.answer == "Paris"
    cell = next(c for c in of_type(events, CellExecuted) if c.iteration == 0)
    assert FACADE_RLM_REFUSED in cell.stdout
    sub_calls = [c for c in of_type(events, LlmCalled) if c.request_kind == "sub"]
    assert len(sub_calls) == 1
    assert sub_calls[0].cell == cell.cell_id
    assert tree.granted == 1
    tools = [t.tool for t in of_type(events, ToolCalled)]
    assert "__dspy_construct__" in tools


async def test_cancel_mid_cell_interrupts_it_and_records_the_cancel(processes: Processes) -> None:
    """The cell writes a file in its workspace and then sleeps: the test cancels once the file
    is there (a barrier, not a timing), and the interrupt ends the cell long before its sleep."""
    code = "import time\nopen('cell-started', 'w').write('1')\ntime.sleep(300)\nprint('woke')"
    script = [step(code, reasoning="wait a long time")]
    with ScriptedLM(script) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            turn = await s.ask("sleep")

            async def cell_started() -> bool:
                try:
                    return (await s.workspace() / "cell-started").exists()
                except AssertionError:
                    return False

            await eventually(cell_started, timeout=60, what="the cell to start")
            await s.append(turn, CancelRequested(reason="user pressed stop"))
            ended = await s.ended(turn, timeout=60)
            events = await s.run_events(turn)
            tree = await s.tree(turn)
    assert isinstance(ended, TurnCancelled), ended
    assert ended.partial == "wait a long time"
    cell = of_type(events, CellExecuted)[-1]
    assert "woke" not in cell.stdout
    assert cell.error  # stopped, not finished
    cancelled = events[-1]
    assert isinstance(cancelled, RunCancelled)
    assert cancelled.reason == "user pressed stop"
    assert not tree.open
    assert sum(fake.calls.values()) == 1


pytestmark = pytest.mark.timeout(240)


async def test_an_rlm_that_never_submits_fails_no_submit_and_no_guess_is_asked(
    processes: Processes,
) -> None:
    # dspy, at its last iteration without SUBMIT, asks an extract step for the outputs: a
    # guess. The run fails no_submit instead, and that model call is never made.
    script = [step(f"print({n})", reasoning=f"look {n}") for n in range(4)]  # max_iters: 4
    script.append(fields(reasoning="a guess", answer="1269"))  # what extract would be told
    with ScriptedLM(script) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            turn = await s.ask("count the NEEDLE lines")
            ended = await s.ended(turn)
            events = await s.run_events(turn)
    assert isinstance(ended, TurnFailed), ended
    assert ended.code == "no_submit"
    assert "used all 4 of its iterations without calling SUBMIT" in ended.error
    assert of_type(events, RunCompleted) == []
    (failed,) = of_type(events, RunFailed)
    assert failed.reason == "no_submit"
    assert sum(fake.calls.values()) == 4  # the four steps; no extract call
    cells = of_type(events, CellExecuted)
    steps = [c for c in cells if not c.setup]
    assert [c.stdout.strip() for c in steps] == ["0", "1", "2", "3"]
    # the framework's own set-up code is recorded for replay, and marked as not the model's
    (setup,) = [c for c in cells if c.setup]
    assert (setup.iteration, "dspy" in setup.code) == (None, True)
