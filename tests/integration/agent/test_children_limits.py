"""The recursive engine's limits met by sandbox code in real turns (issue 9): at most
`MAX_SIBLINGS` children of one `sub_rlm_batched` call at once, a waiting `sub_rlm` that takes
its deadline from the tree (not the sandbox's 600 s host-call default), and the tree's depth
limit answered to the sandbox code as a refusal it can act on.

A real broker, a real budget and real agent replicas as processes; the scripted LM (a FAKE
model server) answers by what each prompt holds and holds chosen replies at gates, so the
tests see what is in a model call at a known point without guessing a time.
"""

import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fleet_agent.engine import children
from fleet_events import streams
from fleet_events.budget import ChildRefused, tree_subject
from fleet_events.envelope import Event
from fleet_events.run import TERMINAL as RUN_TERMINAL
from fleet_events.run import (
    ChildRunCompleted,
    ChildRunFailed,
    ChildRunRequested,
    LlmCalled,
    RunCancelled,
    RunCompleted,
    RunStarted,
)
from fleet_events.sandbox import ChildIsolationDecided, SandboxDeleted
from fleet_events.session import TurnCompleted
from fleet_harness.scripted_lm import Reply, ScriptedLM, ScriptedRequest
from fleet_harness.waits import eventually
from fleet_mesh.runtime_config import RuntimeConfig
from fleet_mesh.store import EventStore

from .rlm_kit import (
    Processes,
    Session,
    of_type,
    processes,
    session,
    start_mesh,
    step,
    stop_mesh,
)

__all__ = ["processes"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

AGENT_ENV = {
    "FLEET_AGENT_TURN_SLOTS": "2",
    # more child slots than siblings: only the per-call limit can hold the fan-out to 4
    "FLEET_ENGINE_CHILD_SLOTS": "8",
    "FLEET_ENGINE_MAX_ITERS": "4",
    "FLEET_ENGINE_MAX_DEPTH": "1",
    "FLEET_ENGINE_MAX_LLM_CALLS": "30",
}

SIBLINGS = 6
NAMES = tuple(f"n{i}" for i in range(SIBLINGS))
FAN = f"answers = sub_rlm_batched([f'sibling task n{{i}}' for i in range({SIBLINGS})])"


class Arrivals:
    """Which siblings reached their model call (each held at its own gate) and which the test
    released; `peak` is the most that were held in a model call at once, counted as each
    one arrives."""

    def __init__(self) -> None:
        self.arrived: list[str] = []
        self.released: list[str] = []
        self.peak = 0
        self._lock = threading.Lock()

    def arrive(self, name: str) -> None:
        with self._lock:
            self.arrived.append(name)
            self.peak = max(self.peak, len(self.arrived) - len(self.released))

    def release_latest(self, fake: ScriptedLM) -> str:
        """Release the latest held arrival (so the siblings end in another order than asked)."""
        with self._lock:
            name = next(n for n in reversed(self.arrived) if n not in self.released)
            self.released.append(name)
        fake.gate(f"child-{name}").release()
        return name


def siblings_script(arrivals: Arrivals) -> Callable[[ScriptedRequest], Reply]:
    def answer(request: ScriptedRequest) -> Reply:
        text = request.prompt_text
        if "ROOT" in text:
            if "answers = sub_rlm_batched" in text:
                return Reply(step("SUBMIT(answer=' '.join(answers))"), key="root-2")
            return Reply(step(FAN + "\nprint(answers)"), key="root-1")
        found = re.search(r"sibling task (n\d)", text)
        assert found, "a request from neither the root nor a sibling"
        arrivals.arrive(found.group(1))
        return Reply(step("SUBMIT(answer=task.split()[-1])"), key=f"child-{found.group(1)}")

    return answer


def open_at_once(events: list[Event]) -> int:
    """The most children of the run asked for and not yet ended, over its record in order."""
    open_, most = 0, 0
    for event in events:
        if isinstance(event, ChildRunRequested):
            open_ += 1
            most = max(most, open_)
        elif isinstance(event, ChildRunCompleted | ChildRunFailed):
            open_ -= 1
    return most


async def test_a_batched_call_of_six_runs_at_most_four_siblings_at_once(
    processes: Processes,
) -> None:
    assert children.MAX_SIBLINGS == 4
    arrivals = Arrivals()
    with ScriptedLM(siblings_script(arrivals)) as fake:
        for name in NAMES:
            fake.gate(f"child-{name}")
        async with session(processes) as s:
            await s.use_model(fake)
            config = await RuntimeConfig.open(s.nc.jetstream())
            # each child a fresh REPL context on the session's sandbox: no forks to wait on
            await config.set("rlm_child_isolation_mode", "context", tenant=s.tenant)
            turn = await s.ask("ROOT: fan out to six siblings")
            # each round waits until four are held in a model call (fewer once fewer are
            # left), then releases one: the next sibling can only start after one ends
            for round_ in range(SIBLINGS):
                want = min(SIBLINGS, round_ + children.MAX_SIBLINGS)

                def reached(want: int = want) -> bool:
                    return len(arrivals.arrived) >= want

                await eventually(reached, timeout=60, what=f"{want} siblings at the model")
                arrivals.release_latest(fake)
            ended = await s.ended(turn, timeout=60)
            events = await s.run_events(turn)
    assert isinstance(ended, TurnCompleted), [e for e in events if not isinstance(e, LlmCalled)]
    # every answer in the order asked, though they ended in another order
    assert ended.answer == " ".join(NAMES)
    assert arrivals.released != sorted(arrivals.released)
    assert sorted(arrivals.arrived) == sorted(NAMES)
    assert arrivals.peak == children.MAX_SIBLINGS
    requested = of_type(events, ChildRunRequested)
    assert sorted(r.batch_index for r in requested) == list(range(SIBLINGS))
    assert len(of_type(events, ChildRunCompleted)) == SIBLINGS
    # the parent's own record: never more than four asked for and not yet ended
    assert open_at_once(events) == children.MAX_SIBLINGS
    assert fake.calls == {"root-1": 1, "root-2": 1, **{f"child-{n}": 1 for n in NAMES}}


DEADLINE_S = 20
SLOW_CHILD = """\
try:
    got = sub_rlm('slow child task: answer when the gate opens')
    outcome = 'answered: ' + got
except Exception as exc:
    outcome = 'sub_rlm raised ' + type(exc).__name__ + ': ' + str(exc)
print('first cell' + ' done')
"""


def deadline_script(request: ScriptedRequest) -> Reply:
    text = request.prompt_text
    if "ROOT" in text:
        if "first cell done" in text:
            return Reply(step("SUBMIT(answer=outcome)"), key="root-2")
        return Reply(step(SLOW_CHILD), key="root-1")
    assert "slow child task" in text, "a request from neither the root nor the child"
    return Reply(step("SUBMIT(answer='late')"), key="child")


@pytest.fixture
def short_deadline(tmp_path: Path) -> Iterator[Processes]:
    """A mesh of its own whose trees may run `DEADLINE_S` seconds (an agent setting)."""
    env = {**AGENT_ENV, "FLEET_ENGINE_TREE_DEADLINE_S": str(DEADLINE_S)}
    running = start_mesh(tmp_path, env)
    yield running
    stop_mesh(running)


async def test_a_waiting_sub_rlm_ends_at_the_trees_deadline_with_an_error_the_code_sees(
    short_deadline: Processes,
) -> None:
    with ScriptedLM(deadline_script) as fake:
        gate = fake.gate("child")  # the child's one model call is held until the turn ended
        async with session(short_deadline) as s:
            await s.use_model(fake)
            turn = await s.ask("ROOT: wait on a child that is held")
            await eventually(gate.reached.is_set, timeout=60, what="the child's model call")
            # far below the sandbox's 600 s host-call default: the tree's deadline ends it
            ended = await s.ended(turn, timeout=DEADLINE_S + 90)
            held_to_the_end = not gate.released.is_set()
            events = await s.run_events(turn)
            (started,) = of_type(events, RunStarted)
            (decided,) = of_type(await s.sandbox_events(started.sandbox), ChildIsolationDecided)
            assert decided.child is not None
            child = decided.child

            async def child_sandbox_deleted() -> list[Event]:
                return of_type(await s.sandbox_events(child), SandboxDeleted)

            # the parent reaped the child's sandbox when it stopped waiting
            await eventually(child_sandbox_deleted, timeout=30, what="the child's sandbox deleted")
            (requested,) = of_type(events, ChildRunRequested)
            gate.release()
            # the child, let go, ends too: nothing runs on unseen
            child_end = await eventually(
                lambda: _last_if_terminal(s, requested.child_run),
                timeout=60,
                what="the held child to end",
            )
    assert held_to_the_end
    assert isinstance(ended, TurnCompleted), [e for e in events if not isinstance(e, LlmCalled)]
    (failed,) = of_type(events, ChildRunFailed)
    assert failed.child_run == requested.child_run
    assert failed.error == f"child run {requested.child_run}: no answer before the tree's deadline"
    assert not failed.cancelled
    # the sandbox code saw the engine's own message (the relay's bare timeout did not beat it)
    assert ended.answer == f"sub_rlm raised RuntimeError: RuntimeError: {failed.error}", (
        ended.answer
    )
    # let go after the turn ended, the child stops at its next step and records why
    assert isinstance(child_end, RunCancelled), child_end
    assert child_end.reason == "the turn has ended"
    assert not of_type(events, ChildRunCompleted)


async def _last_if_terminal(s: Session, run: str) -> Event | None:
    events = await s.events_of(run)
    if events and isinstance(events[-1], RUN_TERMINAL):
        return events[-1]
    return None


DEEPER = """\
try:
    deeper = sub_rlm('grandchild task: one level too deep')
except Exception as exc:
    deeper = 'refused: ' + type(exc).__name__ + ' | ' + str(exc)
SUBMIT(answer=deeper)
"""


def depth_script(request: ScriptedRequest) -> Reply:
    text = request.prompt_text
    if "ROOT" in text:
        return Reply(
            step("SUBMIT(answer=sub_rlm('depth child task: try to go deeper'))"), key="root"
        )
    assert "depth child task" in text, "a request from neither the root nor the child"
    return Reply(step(DEEPER), key="child")


async def test_a_child_at_the_max_depth_is_refused_sub_rlm_and_answers_itself(
    processes: Processes,
) -> None:
    with ScriptedLM(depth_script) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            turn = await s.ask("ROOT: a child that tries to go deeper")
            ended = await s.ended(turn, timeout=90)
            events = await s.run_events(turn)
            (child,) = of_type(events, ChildRunRequested)
            child_events = await s.events_of(child.child_run)
            (grandchild,) = of_type(child_events, ChildRunRequested)
            grandchild_events = await s.events_of(grandchild.child_run)
            ledger = EventStore(s.nc.jetstream(), streams.BUDGET, s.codec)
            tree = (await s.tree(turn)).tree
            refused = [
                stored.envelope.data
                async for stored in ledger.replay(tree_subject(tree))
                if isinstance(stored.envelope.data, ChildRefused)
            ]
            status = await s.tree(turn)
    assert isinstance(ended, TurnCompleted), [e for e in events if not isinstance(e, LlmCalled)]
    message = (
        "child run at depth 2 is over the tree's max_depth 1: answer this sub-task without sub_rlm"
    )
    # the code caught the refusal and answered with it: the turn goes on, nothing crashed
    assert ended.answer == f"refused: RuntimeError | RuntimeError: {message}", ended.answer
    assert (child.depth, grandchild.depth) == (1, 2)
    (failed,) = of_type(child_events, ChildRunFailed)
    assert (failed.child_run, failed.error) == (grandchild.child_run, message)
    assert isinstance(child_events[-1], RunCompleted)
    # the refusal is in the tree's ledger; the grandchild never ran, nor called the model
    (refusal,) = refused
    assert (refusal.child_run, refusal.reason, refusal.depth, refusal.max_depth) == (
        grandchild.child_run, "depth_limit", 2, 1,
    )  # fmt: skip
    assert refusal.message == message
    assert status.refusals == 1
    assert grandchild_events == []
    assert fake.calls == {"root": 1, "child": 1}
