"""Child runs (`sub_rlm_batched`) as work items: a real broker builds each child sandbox under
its isolation policy, a real budget admits each child, and the children run as their own
recorded runs, on the same replica's child slots. The scripted LM (a FAKE model server)
answers the root and each child by what its prompt holds (children run concurrently, so a
list of replies in order would not do)."""

import re
from collections.abc import Callable

import pytest

from fleet_agent.engine import child_run_id, root_run_id
from fleet_events.envelope import Event
from fleet_events.run import (
    ChildRunCompleted,
    ChildRunFailed,
    ChildRunRequested,
    IterationPlanned,
    LlmCalled,
    RunCancelled,
    RunCompleted,
    RunStarted,
    ToolCalled,
)
from fleet_events.sandbox import ChildIsolationDecided, SandboxDeleted
from fleet_events.session import CancelRequested, TurnCancelled, TurnCompleted
from fleet_harness.scripted_lm import Reply, ScriptedLM, ScriptedRequest
from fleet_harness.waits import WaitTimeout, eventually

from .rlm_kit import Processes, Session, of_type, processes, session, step

__all__ = ["processes"]

AGENT_ENV = {
    "FLEET_AGENT_TURN_SLOTS": "2",
    "FLEET_ENGINE_CHILD_SLOTS": "2",
    "FLEET_ENGINE_MAX_ITERS": "4",
    "FLEET_ENGINE_MAX_LLM_CALLS": "20",
}

NAMES = ("alpha", "beta", "gamma")
FAN_OUT = "answers = sub_rlm_batched(['child task alpha', 'child task beta', 'child task gamma'])"


def fan_out_script(first_cell: str, child_answer: str) -> Callable[[ScriptedRequest], Reply]:
    """Root (its task says ROOT): `first_cell`, then the fan-out, then SUBMIT of the joined
    answers; each child (its task says `child task <name>`) submits `child_answer` at once."""

    def answer(request: ScriptedRequest) -> Reply:
        text = request.prompt_text
        if "ROOT" in text:
            if "answers = sub_rlm_batched" in text:
                return Reply(step("SUBMIT(answer=' '.join(answers))"), key="root-3")
            if "first cell done" in text:
                return Reply(step(FAN_OUT + "\nprint(answers)"), key="root-2")
            return Reply(step(first_cell + "\nprint('first cell done')"), key="root-1")
        name = re.search(r"child task (alpha|beta|gamma)", text)
        assert name, "a request from neither the root nor a child"
        return Reply(step(f"SUBMIT(answer={child_answer})"), key=f"child-{name.group(1)}")

    return answer


async def fanned_out(s: Session, turn: str) -> tuple[TurnCompleted, list[Event], str]:
    try:
        ended = await s.ended(turn, timeout=60)
    except WaitTimeout as exc:  # say where the tree stood
        stood: list[object] = [e for e in await s.run_events(turn) if not isinstance(e, LlmCalled)]
        for r in of_type(await s.run_events(turn), ChildRunRequested):
            stood += [(r.child_run, e) for e in await s.events_of(r.child_run)]
        raise AssertionError(f"{exc}: {stood}") from exc
    events = await s.run_events(turn)
    assert isinstance(ended, TurnCompleted), [e for e in events if not isinstance(e, LlmCalled)]
    (started,) = of_type(events, RunStarted)
    return ended, events, started.sandbox


async def assert_children_recorded(s: Session, turn: str, events: list[Event]) -> list[str]:
    requested = of_type(events, ChildRunRequested)
    completed = of_type(events, ChildRunCompleted)
    assert sorted(r.batch_index for r in requested) == [0, 1, 2]
    assert {r.depth for r in requested} == {1}
    (call,) = {r.call_id for r in requested}
    tool_calls = [t for t in of_type(events, ToolCalled) if t.tool == "sub_rlm_batched"]
    assert [t.call_id for t in tool_calls] == [call]
    children = [r.child_run for r in requested]
    assert sorted(c.child_run for c in completed) == sorted(children)
    for done in completed:
        # each parent record ties in the child's chain, by the head hash the store holds
        assert done.child_head_hash == await s.head_of(done.child_run)
        child_events = await s.events_of(done.child_run)
        first, last = child_events[0], child_events[-1]
        assert isinstance(first, RunStarted)
        assert (first.depth, first.parent_call) == (1, call)
        assert isinstance(last, RunCompleted)
        assert last.answer == done.answer
        steps = [c for c in of_type(child_events, LlmCalled) if c.request_kind == "step"]
        assert len(steps) == 1
    root = root_run_id(s.tenant, s.session, turn)
    # derived ids: a resumed parent asks for the same children (issue 16)
    assert all(r.child_run == child_run_id(root, call, r.batch_index) for r in requested)
    return children


async def assert_reaped(s: Session, parent_sandbox: str, branch: str, count: int = 3) -> None:
    decided = of_type(await s.sandbox_events(parent_sandbox), ChildIsolationDecided)
    assert [d.branch for d in decided] == [branch] * count

    async def all_deleted() -> bool:
        for d in decided:
            assert d.child is not None
            if not of_type(await s.sandbox_events(d.child), SandboxDeleted):
                return False
        return True

    await eventually(all_deleted, timeout=30, what="every child sandbox to be deleted")


async def test_three_children_under_the_fork_policy_see_the_parents_repl(
    processes: Processes,
) -> None:
    script = fan_out_script("base = 7", "task.split()[-1] + ':' + str(base)")
    with ScriptedLM(script) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            turn = await s.ask("ROOT: fan out to three children")
            ended, events, sandbox = await fanned_out(s, turn)
            await assert_children_recorded(s, turn, events)
            await assert_reaped(s, sandbox, "fork")
            tree = await s.tree(turn)
    assert ended.answer == "alpha:7 beta:7 gamma:7"
    expected = {"root-1", "root-2", "root-3", "child-alpha", "child-beta", "child-gamma"}
    assert fake.calls == dict.fromkeys(expected, 1)
    assert tree.granted == 0  # every call was some run's own step: no sub calls spent


async def test_three_children_take_the_clean_fallback_when_the_parent_cannot_fork(
    processes: Processes,
) -> None:
    unforkable = (
        "import threading\nstop = threading.Event()\n"
        "threading.Thread(target=stop.wait, daemon=True).start()"
    )
    script = fan_out_script(unforkable, "task.split()[-1] + ':' + str('stop' in globals())")
    with ScriptedLM(script) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            turn = await s.ask("ROOT: fan out from a parent with a live thread")
            ended, events, sandbox = await fanned_out(s, turn)
            await assert_children_recorded(s, turn, events)
            await assert_reaped(s, sandbox, "clean_fallback")
    assert ended.answer == "alpha:False beta:False gamma:False"


pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def sleeping_children_script(request: ScriptedRequest) -> Reply:
    """The root fans out to two children; each child's one cell sleeps for five minutes."""
    text = request.prompt_text
    if "ROOT" in text:
        fan = "answers = sub_rlm_batched(['child task alpha', 'child task beta'])"
        return Reply(step(fan, reasoning="fan out and wait"), key="root")
    name = re.search(r"child task (alpha|beta)", text)
    assert name, "a request from neither the root nor a child"
    code = "import time\ntime.sleep(300)\nSUBMIT(answer='late')"
    return Reply(step(code, reasoning="sleep"), key=f"child-{name.group(1)}")


async def test_cancel_mid_children_cancels_them_and_reaps_their_sandboxes(
    processes: Processes,
) -> None:
    """The barrier: both children have planned their sleeping cell (the plan is recorded just
    before the cell runs; a cancel that beats the cell to the sandbox is sent again)."""
    with ScriptedLM(sleeping_children_script) as fake:
        async with session(processes) as s:
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
            await s.append(turn, CancelRequested(reason="user pressed stop"))
            ended = await s.ended(turn, timeout=120)
            events = await s.run_events(turn)
            (started,) = of_type(events, RunStarted)
            for child in children:
                last = (await s.events_of(child))[-1]
                assert isinstance(last, RunCancelled), last
                assert last.reason == "user pressed stop"
            await assert_reaped(s, started.sandbox, "fork", count=2)
    assert isinstance(ended, TurnCancelled), ended
    failed = of_type(events, ChildRunFailed)
    assert sorted(f.child_run for f in failed) == sorted(children)
    assert all(f.cancelled for f in failed)
    for f in failed:
        assert f.child_head_hash  # the cancelled child's chain is still tied in
    root_end = events[-1]
    assert isinstance(root_end, RunCancelled)
    # nothing after the root's end: the children's results were recorded before it
    assert all(isinstance(e, RunCancelled) for e in events[events.index(root_end) :])
    assert fake.calls == {"root": 1, "child-alpha": 1, "child-beta": 1}
