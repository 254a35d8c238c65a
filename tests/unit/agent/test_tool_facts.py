"""A chat tool's session facts are the call's (`tools.kit.fact_id`): the tool call run again
after its holder died (the one left in flight) finds the facts it stored and stores none twice;
what the turn's state mirrors is the fact that stands, so a core-memory append is made once.

The bus below takes the append the kit hands it and answers with a sequence: it stands for
the NATS round trip (the integration test `test_resume_chat_record` runs the real one)."""

from collections.abc import Coroutine
from types import CoroutineType, SimpleNamespace
from typing import Any, cast

from fleet_agent.chat.tools.kit import Logged, ToolKit, TurnState, fact_id
from fleet_agent.chat.tools.memory import Memory
from fleet_agent.engine.model import RunContext
from fleet_agent.engine.recorder import RunRecorder
from fleet_events import Event
from fleet_events.session import CoreMemory, CoreMemoryChanged, MemoryFileWritten

RUN = "run-1"


class Bus:
    """The appends asked for: (event, envelope id, causation)."""

    def __init__(self) -> None:
        self.appends: list[tuple[Event, str, str | None]] = []

    def run(self, work: Coroutine[Any, Any, Any], timeout: float) -> Any:
        frame = cast("CoroutineType[Any, Any, Any]", work).cr_frame
        assert frame is not None
        args = frame.f_locals
        self.appends.append((args["event"], args["event_id"], args["causation"]))
        work.close()
        return SimpleNamespace(seq=100 + len(self.appends))

    def put_file(self, sandbox: str, path: str, data: bytes) -> None:
        pass


def kit(bus: Bus, memory: CoreMemory, stored: dict[str, Logged[Event]] | None = None) -> ToolKit:
    ctx = SimpleNamespace(tenant="t", session="s", turn="u", run=RUN, mesh=SimpleNamespace(bus=bus))
    state = TurnState(memory=memory, documents={}, active=None, memory_files={}, history=[])
    return ToolKit(
        ctx=cast(RunContext, ctx), recorder=cast(RunRecorder, None), state=state,
        engine=cast(Any, None), sandbox=lambda: "sandbox-1", urls=cast(Any, None),
        rlm_task=cast(Any, None), clarify_timeout_s=1.0, mode="auto", stored=stored or {},
    )  # fmt: skip


def test_a_facts_id_is_fixed_by_its_run_its_call_and_its_place() -> None:
    assert fact_id(RUN, "run-1-t3", 1) == fact_id(RUN, "run-1-t3", 1)
    ids = {fact_id(RUN, "run-1-t3", 1), fact_id(RUN, "run-1-t3", 2), fact_id(RUN, "run-1-t4", 1)}
    ids.add(fact_id("run-2", "run-1-t3", 1))
    assert len(ids) == 4
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)  # a subject-safe hex token


def test_facts_logged_inside_a_call_carry_its_id_and_others_a_fresh_one() -> None:
    bus = Bus()
    tools = kit(bus, CoreMemory())
    with tools.calling("run-1-t1"):
        Memory(tools).core_memory_append("human", "likes tea")
        Memory(tools).memory_write("notes.md", "tea")
    Memory(tools).core_memory_append("human", "and cake")
    (_, first, cause1), (_, second, cause2), (_, third, cause3) = bus.appends
    assert (first, cause1) == (fact_id(RUN, "run-1-t1", 1), "run-1-t1")
    assert (second, cause2) == (fact_id(RUN, "run-1-t1", 2), "run-1-t1")
    assert cause3 is None
    assert third not in (first, second)


def test_a_call_run_again_stores_no_fact_twice_and_mirrors_the_stored_one() -> None:
    first = Bus()
    before = kit(first, CoreMemory(human="Ada"))
    with before.calling("run-1-t1"):
        Memory(before).core_memory_append("human", "likes tea")
    ((changed, event_id, _),) = first.appends
    assert isinstance(changed, CoreMemoryChanged)
    # the holder died before the call's result was recorded: the takeover folds the log
    # (the change is in it) and runs the call again under its id
    again = Bus()
    after = kit(again, CoreMemory(human=changed.value), {event_id: Logged(7, changed)})
    with after.calling("run-1-t1"):
        said = Memory(after).core_memory_append("human", "likes tea")
    assert again.appends == []
    assert after.state.memory.human == changed.value == "Ada\nlikes tea"
    assert said == f"core memory 'human' now holds {len(changed.value)} characters"


def test_a_fact_decided_otherwise_on_the_second_run_is_kept_under_an_id_of_its_own() -> None:
    bus = Bus()
    stood = CoreMemoryChanged(block="human", op="append", value="x")
    taken = kit(bus, CoreMemory(), {fact_id(RUN, "run-1-t1", 1): Logged(7, stood)})
    with taken.calling("run-1-t1"):
        Memory(taken).memory_write("notes.md", "tea")
    ((event, event_id, cause),) = bus.appends
    assert isinstance(event, MemoryFileWritten)
    assert cause == "run-1-t1"
    assert event_id != fact_id(RUN, "run-1-t1", 1)  # not dropped as a duplicate of the other
