"""Properties of the session fold over generated sessions.

A hand-written reference model (plain mutable Python, written from the rules in docs/agent.md,
not from the fold) runs the same commands the agent would; the fold over the events they
produced must agree with it, from the start or from a snapshot at any point, and an import
must leave nothing of what came before it.
"""

from dataclasses import dataclass, field
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet_events import Actor, BlobRef, Envelope, Event, utc_now
from fleet_events.run import CellExecuted
from fleet_events.session import (
    CORE_MEMORY_LIMITS,
    CoreMemory,
    CoreMemoryChanged,
    DocumentActivated,
    DocumentLoaded,
    DocumentRef,
    DocumentRemoved,
    HistoryTurn,
    InputProvided,
    InputRequested,
    InterpreterState,
    SandboxAttached,
    SandboxDetached,
    SessionImage,
    SessionImported,
    SessionRestored,
    TurnCancelled,
    TurnCompleted,
    TurnFailed,
    TurnRefused,
    TurnRequested,
    log_subject,
)
from fleet_events.session_fold import (
    EMPTY,
    FOLD,
    SessionState,
    answer_input,
    append_core_memory,
    evolve,
    replace_core_memory,
)
from fleet_mesh.store import StoredEvent

ACTOR = Actor(service="agent", replica="a-0")
BLOCKS = list(CORE_MEMORY_LIMITS)
ALIASES = ["a", "b", "c"]


class FutureFact(Event, frozen=True, kw_only=True, tag="future.props_fact"):
    """A type from a newer replica."""


def stored(data: Event, seq: int, turn: str | None = None) -> StoredEvent:
    env = Envelope(
        id=f"e{seq}", tenant="acme", session="s1", turn=turn, actor=ACTOR, ts=utc_now(), data=data
    )
    return StoredEvent(
        subject=log_subject("acme", "s1"), seq=seq, envelope=env, hash="", prev_hash=""
    )


def doc(alias: str, chars: int) -> DocumentRef:
    blob = BlobRef(object=f"acme/{alias}{chars}", sha256=f"{alias}{chars}", size=chars)
    return DocumentRef(
        alias=alias, source="url", origin=f"https://example.invalid/{alias}", blob=blob, chars=chars
    )


@dataclass
class Reference:
    """The session as a plain model: what the fold must rebuild."""

    turns: list[tuple[str, str]] = field(default_factory=list)
    memory: dict[str, str] = field(default_factory=lambda: dict.fromkeys(BLOCKS, ""))
    documents: list[DocumentRef] = field(default_factory=list)
    active: str | None = None
    sandbox: str | None = None
    volume: str | None = None
    pending: str | None = None

    def replace_with(self, image: SessionImage) -> None:
        self.pending = None
        self.sandbox = self.volume = None
        self.turns = [(t.question, t.answer) for t in image.turns]
        self.memory = {b: getattr(image.core_memory, b) for b in BLOCKS}
        self.documents = list(image.documents)
        self.active = image.active_document
        if image.interpreter is not None:
            self.sandbox, self.volume = image.interpreter.sandbox, image.interpreter.volume

    def matches(self, state: SessionState) -> None:
        image = state.image
        assert [(t.question, t.answer) for t in image.turns] == self.turns
        assert {b: getattr(image.core_memory, b) for b in BLOCKS} == self.memory
        assert list(image.documents) == self.documents
        assert image.active_document == self.active
        interp = image.interpreter
        assert ((interp.sandbox, interp.volume) if interp else (None, None)) == (
            self.sandbox,
            self.volume,
        )
        pending = state.pending_input
        assert (pending.request_id if pending else None) == self.pending


class Session:
    """Runs commands as the agent does: decide against the folded state, append, fold."""

    def __init__(self, first_turn: int = 0) -> None:
        self.events: list[StoredEvent] = []
        self.state = EMPTY
        self.ref = Reference()
        self.turns = first_turn

    def emit(self, data: Event, turn: str | None = None) -> None:
        event = stored(data, len(self.events) + 1, turn)
        self.events.append(event)
        self.state = evolve(self.state, event)

    def run(self, command: tuple[Any, ...]) -> None:
        getattr(self, f"do_{command[0]}")(*command[1:])

    def do_turn(self, question: str, answer: str, ending: str, asks: bool) -> None:
        self.turns += 1
        turn = f"t{self.turns}"
        self.emit(TurnRequested(message=question), turn)
        if asks:
            self.emit(InputRequested(request_id=f"q-{turn}", question="?"), turn)
            self.ref.pending = f"q-{turn}"
        ends: dict[str, Event] = {
            "completed": TurnCompleted(answer=answer),
            "failed": TurnFailed(error="boom"),
            "cancelled": TurnCancelled(partial=answer),
            "refused": TurnRefused(reason="busy", message="another turn runs"),
        }
        self.emit(ends[ending], turn)
        if ending == "completed":
            self.ref.turns.append((question, answer))
        if ending == "cancelled" and answer:
            self.ref.turns.append((question, answer + " [cancelled]"))
        if asks:
            self.ref.pending = None

    def do_append(self, block: str, text: str) -> None:
        self.emit(append_core_memory(self.state.image.core_memory, block, text))
        current = self.ref.memory[block]
        value = f"{current}\n{text}" if current else text
        if text.strip() and len(value) <= CORE_MEMORY_LIMITS[block]:
            self.ref.memory[block] = value

    def do_replace(self, block: str, start: int, length: int, new: str) -> None:
        current = self.ref.memory[block]
        old = current[start : start + length]
        self.emit(replace_core_memory(self.state.image.core_memory, block, old, new))
        value = current.replace(old, new, 1)
        if old and current.count(old) == 1 and len(value) <= CORE_MEMORY_LIMITS[block]:
            self.ref.memory[block] = value

    def do_load(self, alias: str, chars: int) -> None:
        document = doc(alias, chars)
        self.emit(DocumentLoaded(document=document))
        self.ref.documents = [d for d in self.ref.documents if d.alias != alias] + [document]
        self.ref.active = alias

    def do_activate(self, alias: str) -> None:
        self.emit(DocumentActivated(alias=alias))
        found = [d for d in self.ref.documents if d.alias == alias]
        if found:
            self.ref.documents = [d for d in self.ref.documents if d.alias != alias] + found
            self.ref.active = alias

    def do_remove(self, alias: str) -> None:
        self.emit(DocumentRemoved(alias=alias))
        self.ref.documents = [d for d in self.ref.documents if d.alias != alias]
        if self.ref.active == alias:
            self.ref.active = None

    def do_attach(self, sandbox: str) -> None:
        self.emit(SandboxAttached(interpreter=InterpreterState(sandbox=sandbox, volume="vol")))
        self.ref.sandbox, self.ref.volume = sandbox, "vol"

    def do_detach(self, sandbox: str) -> None:
        self.emit(SandboxDetached(sandbox=sandbox))
        if self.ref.sandbox == sandbox:
            self.ref.sandbox = None

    def do_ask(self, request_id: str) -> None:
        self.emit(InputRequested(request_id=request_id, question="?", options=("yes",)))
        self.ref.pending = request_id

    def do_answer(self, request_id: str, option: str) -> None:
        if request_id == "pending" and self.state.pending_input is not None:
            request_id = self.state.pending_input.request_id
        decided = answer_input(self.state, request_id, "ok", option=option)
        self.emit(decided)
        if isinstance(decided, InputProvided):
            assert self.ref.pending == request_id
            self.ref.pending = None

    def do_import(self, image: SessionImage, restore: bool) -> None:
        self.emit(SessionRestored(image=image) if restore else SessionImported(image=image))
        self.ref.replace_with(image)

    def do_noise(self, future: bool) -> None:
        self.emit(FutureFact() if future else CellExecuted(code="print(1)"))


texts = st.text(alphabet="ab \n", max_size=40) | st.builds(lambda n: "x" * n, st.integers(0, 2100))
images = st.builds(
    SessionImage,
    turns=st.lists(
        st.builds(HistoryTurn, question=st.text(max_size=5), answer=st.text(max_size=5)), max_size=3
    ).map(tuple),
    core_memory=st.builds(CoreMemory, persona=st.text(max_size=10), human=st.text(max_size=10)),
    documents=st.lists(st.builds(doc, st.sampled_from(ALIASES), st.integers(1, 9)), max_size=2).map(
        lambda ds: tuple({d.alias: d for d in ds}.values())
    ),
    interpreter=st.none()
    | st.builds(InterpreterState, sandbox=st.just("sb-i"), volume=st.just("v2")),
)
commands = st.one_of(
    st.tuples(
        st.just("turn"),
        st.text(max_size=8),
        st.text(max_size=8),
        st.sampled_from(["completed", "failed", "cancelled", "refused"]),
        st.booleans(),
    ),
    st.tuples(st.just("append"), st.sampled_from(BLOCKS), texts),
    st.tuples(
        st.just("replace"), st.sampled_from(BLOCKS), st.integers(0, 30), st.integers(0, 6), texts
    ),
    st.tuples(st.just("load"), st.sampled_from(ALIASES), st.integers(1, 9)),
    st.tuples(st.just("activate"), st.sampled_from([*ALIASES, "ghost"])),
    st.tuples(st.just("remove"), st.sampled_from(ALIASES)),
    st.tuples(st.just("attach"), st.sampled_from(["sb1", "sb2"])),
    st.tuples(st.just("detach"), st.sampled_from(["sb1", "sb2"])),
    st.tuples(st.just("ask"), st.sampled_from(["q1", "q2"])),
    st.tuples(
        st.just("answer"),
        st.sampled_from(["pending", "q1", "q2"]),
        st.sampled_from(["", "yes", "no"]),
    ),
    st.tuples(st.just("import"), images, st.booleans()),
    st.tuples(st.just("noise"), st.booleans()),
)
sessions = st.lists(commands, max_size=40)


def play(script: list[tuple[Any, ...]], first_turn: int = 0) -> Session:
    session = Session(first_turn)
    for command in script:
        session.run(command)
    return session


def refold(events: list[StoredEvent], state: SessionState = EMPTY) -> SessionState:
    for event in events:
        state = FOLD.evolve(state, event)
    return state


@settings(max_examples=300, deadline=None)
@given(script=sessions)
def test_the_fold_rebuilds_what_the_reference_model_holds(script: list[tuple[Any, ...]]) -> None:
    session = play(script)
    session.ref.matches(session.state)
    assert refold(session.events) == session.state


@settings(max_examples=200, deadline=None)
@given(script=sessions, cut=st.integers(0, 60))
def test_snapshot_plus_tail_equals_replay_equals_live(
    script: list[tuple[Any, ...]], cut: int
) -> None:
    session = play(script)
    cut = min(cut, len(session.events))
    at_cut = refold(session.events[:cut])
    snapshot = msgspec.msgpack.decode(msgspec.msgpack.encode(at_cut), type=FOLD.state_type)
    assert refold(session.events[cut:], snapshot) == refold(session.events) == session.state


@settings(max_examples=200, deadline=None)
@given(before=sessions, image=images, restore=st.booleans(), after=sessions)
def test_an_import_leaves_nothing_of_what_came_before(
    before: list[tuple[Any, ...]], image: SessionImage, restore: bool, after: list[tuple[Any, ...]]
) -> None:
    imported = ("import", image, restore)
    with_past = play([*before, imported, *after])
    without = play([imported, *after], first_turn=sum(c[0] == "turn" for c in before))
    strip = {"requests": {}, "skipped": (), "skipped_count": 0}  # the log still holds these
    assert msgspec.structs.replace(with_past.state, **strip) == msgspec.structs.replace(
        without.state, **strip
    )


@settings(max_examples=300, deadline=None)
@given(script=sessions)
def test_no_block_ever_holds_more_than_its_limit(script: list[tuple[Any, ...]]) -> None:
    session = play(script)
    for block, limit in CORE_MEMORY_LIMITS.items():
        assert len(getattr(session.state.image.core_memory, block)) <= limit
    changes = [
        e.envelope.data for e in session.events if isinstance(e.envelope.data, CoreMemoryChanged)
    ]
    assert all(len(c.value) <= CORE_MEMORY_LIMITS[c.block] for c in changes)
