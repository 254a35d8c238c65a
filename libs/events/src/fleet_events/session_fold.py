"""The session model: a session's state is a fold over its `.log`; core-memory, input and
turn-request decisions over it are pure too. No I/O: the agent and the gateway both use it.

Any agent replica rebuilds a session by replaying `fleet.session.<tenant>.<session>.log` (or a
snapshot plus its tail) through `SessionFold`, so no replica holds a session of its own; the
gateway's writer folds the same log to decide a turn request (is its idempotency key known, are
its documents loaded) and its projector keeps the same state per session row. The fold does no
I/O and never raises on an event: a type it does not know (written by a newer replica) is
skipped and counted in the state, so a replica one version behind keeps working and its caller
can say so in one log line (`skipped_line`). Import and restore replace the image; an empty log
is the empty state. Bump `SessionFold.version` whenever `evolve` changes meaning, including
when it learns a new event type, so snapshots folded without it are ignored.

Every `turn.requested` is remembered by its event id (`requests`): a client's idempotency key
becomes that id (a hash of tenant, session and key, made by the gateway), so a retry is
answered from the fold however long ago the first came, not from the stream's duplicate
window, and only inside the session's own log.
"""

import hashlib
from typing import Any, Protocol

import msgspec

from fleet_events.catalog import ALL_EVENTS, type_of
from fleet_events.envelope import Envelope, Event
from fleet_events.session import (
    CORE_MEMORY_LIMITS,
    CoreMemory,
    CoreMemoryChanged,
    CoreMemoryRefused,
    DocumentActivated,
    DocumentLoaded,
    DocumentRef,
    DocumentRemoved,
    HistoryTurn,
    InputExpired,
    InputProvided,
    InputRefused,
    InputRequested,
    MemoryFileWritten,
    SandboxAttached,
    SandboxDetached,
    SessionDeleted,
    SessionImage,
    SessionImported,
    SessionRestored,
    TurnCancelled,
    TurnCompleted,
    TurnFailed,
    TurnRefused,
    TurnRequested,
)


class Unknown(Event, frozen=True, kw_only=True, tag="agent.unknown_type"):
    """Stands in memory for an event of type `of_type` that a lenient reader could not decode
    (a newer writer's type); never stored (it is in no catalog)."""

    of_type: str


KNOWN: frozenset[type[Event]] = frozenset(ALL_EVENTS)

CANCELLED_MARK = "[cancelled]"
"""Ends a cancelled turn's partial answer in the history, as the earlier system kept it: the
next turn's model sees what was said and that it was cut short."""


class Stored(Protocol):
    """What the fold reads of a stored event (`fleet_mesh.store.StoredEvent` is one)."""

    @property
    def seq(self) -> int: ...

    @property
    def envelope(self) -> Envelope[Any]: ...


class PendingInput(msgspec.Struct, frozen=True, kw_only=True):
    """The question a parked turn waits on; `turn` ends it too when that turn ends."""

    request_id: str
    question: str
    options: tuple[str, ...] = ()
    timeout_s: float = 0.0
    turn: str | None = None
    run: str | None = None


class OpenTurn(msgspec.Struct, frozen=True, kw_only=True):
    """A user message whose turn has not ended: its answer completes a history turn."""

    turn: str
    question: str


class AskedTurn(msgspec.Struct, frozen=True, kw_only=True):
    """A `turn.requested` as a retry of it is answered: its turn, where it was stored, and a
    digest of what it asked (`request_digest`), so a different body under its id is told."""

    turn: str
    seq: int
    digest: str


class SessionState(msgspec.Struct, frozen=True, kw_only=True):
    """What a turn needs of its session, rebuilt from the log (and snapshotted as msgpack).

    `requests` maps the event id of every turn request to its `AskedTurn`, first one standing.
    `skipped` names the event types this fold version did not know, first seen first;
    `skipped_count` counts every event skipped for that reason.
    """

    image: SessionImage = SessionImage()
    open_turns: tuple[OpenTurn, ...] = ()
    pending_input: PendingInput | None = None
    deleted: bool = False
    requests: dict[str, AskedTurn] = {}
    skipped: tuple[str, ...] = ()
    skipped_count: int = 0


EMPTY = SessionState()


def _with_image(state: SessionState, **changes: Any) -> SessionState:
    return msgspec.structs.replace(state, image=msgspec.structs.replace(state.image, **changes))


def _skip(state: SessionState, data: Event) -> SessionState:
    name = _type_name(data)
    skipped = state.skipped if name in state.skipped else (*state.skipped, name)
    return msgspec.structs.replace(state, skipped=skipped, skipped_count=state.skipped_count + 1)


def _type_name(data: Event) -> str:
    return data.of_type if isinstance(data, Unknown) else type_of(data)


def _end_turn(state: SessionState, turn: str | None, answer: str | None) -> SessionState:
    """Close `turn`; with an answer it joins the history, with a question to pair it with."""
    opened = next((t for t in state.open_turns if t.turn == turn), None)
    open_turns = tuple(t for t in state.open_turns if t.turn != turn)
    pending = state.pending_input
    if pending is not None and pending.turn == turn:
        pending = None
    state = msgspec.structs.replace(state, open_turns=open_turns, pending_input=pending)
    if answer is None or opened is None:
        return state
    entry = HistoryTurn(question=opened.question, answer=answer, turn=opened.turn)
    return _with_image(state, turns=(*state.image.turns, entry))


def _replaced(state: SessionState, image: SessionImage) -> SessionState:
    """Import and restore: nothing of the old state survives but the fold's own bookkeeping
    (the requests stay: the log still holds them, and a retry of one is still that one)."""
    return SessionState(
        image=image,
        deleted=state.deleted,
        requests=state.requests,
        skipped=state.skipped,
        skipped_count=state.skipped_count,
    )


def request_digest(request: TurnRequested) -> str:
    """What a turn request asked, as one value: two requests are the same when it is."""
    return hashlib.sha256(msgspec.json.encode(request)).hexdigest()


def _asked(state: SessionState, event: Stored, turn: str, request: TurnRequested) -> SessionState:
    env = event.envelope
    if env.id in state.requests:
        return state
    asked = AskedTurn(turn=turn, seq=event.seq, digest=request_digest(request))
    return msgspec.structs.replace(state, requests={**state.requests, env.id: asked})


def _documents(state: SessionState, alias: str) -> tuple[DocumentRef, ...]:
    return tuple(d for d in state.image.documents if d.alias != alias)


def evolve(state: SessionState, event: Stored) -> SessionState:
    """Fold one stored event in. Events of other concerns (run steps, renames) change nothing."""
    env = event.envelope
    data = env.data
    match data:
        case TurnRequested(message=message) if env.turn is not None:
            state = _asked(state, event, env.turn, data)
            if any(t.turn == env.turn for t in state.open_turns):
                return state  # the same turn asked twice: the first request stands
            opened = (*state.open_turns, OpenTurn(turn=env.turn, question=message))
            return msgspec.structs.replace(state, open_turns=opened)
        case TurnCompleted(answer=answer):
            return _end_turn(state, env.turn, answer)
        case TurnCancelled(partial=partial) if partial:
            return _end_turn(state, env.turn, f"{partial} {CANCELLED_MARK}")
        case TurnFailed() | TurnCancelled() | TurnRefused():
            return _end_turn(state, env.turn, None)
        case CoreMemoryChanged(block=block, value=value) if block in CORE_MEMORY_LIMITS:
            memory = msgspec.structs.replace(state.image.core_memory, **{block: value})
            return _with_image(state, core_memory=memory)
        case MemoryFileWritten(file=file):
            files = (*(f for f in state.image.memory_files if f.path != file.path), file)
            return _with_image(state, memory_files=files)
        case DocumentLoaded(document=document):
            documents = (*_documents(state, document.alias), document)
            return _with_image(state, documents=documents, active_document=document.alias)
        case DocumentActivated(alias=alias):
            found = [d for d in state.image.documents if d.alias == alias]
            if not found:
                return state
            documents = (*_documents(state, alias), found[0])
            return _with_image(state, documents=documents, active_document=alias)
        case DocumentRemoved(alias=alias):
            active = None if state.image.active_document == alias else state.image.active_document
            return _with_image(state, documents=_documents(state, alias), active_document=active)
        case SandboxAttached(interpreter=interpreter):
            return _with_image(state, interpreter=interpreter)
        case SandboxDetached(sandbox=sandbox):
            current = state.image.interpreter
            if current is None or current.sandbox != sandbox:
                return state
            return _with_image(state, interpreter=msgspec.structs.replace(current, sandbox=None))
        case InputRequested():
            pending = PendingInput(
                request_id=data.request_id,
                question=data.question,
                options=data.options,
                timeout_s=data.timeout_s,
                turn=env.turn,
                run=env.run,
            )
            return msgspec.structs.replace(state, pending_input=pending)
        case InputProvided(request_id=request_id) | InputExpired(request_id=request_id):
            waiting = state.pending_input
            if waiting is None or waiting.request_id != request_id:
                return state
            return msgspec.structs.replace(state, pending_input=None)
        case SessionImported(image=image) | SessionRestored(image=image):
            return _replaced(state, image)
        case SessionDeleted():
            return msgspec.structs.replace(state, deleted=True)
    if type(data) not in KNOWN:
        return _skip(state, data)
    return state


class SessionFold:
    """The session fold as `fleet_mesh.store.EventStore.load(filter, fold)` takes it."""

    name = "session"
    version = 2
    state_type = SessionState

    def initial(self) -> SessionState:
        return EMPTY

    def evolve(self, state: SessionState, event: Stored) -> SessionState:
        return evolve(state, event)


FOLD = SessionFold()


def skipped_line(state: SessionState) -> str | None:
    """The one log line a caller writes after a load that skipped unknown event types."""
    if not state.skipped_count:
        return None
    return (
        f"skipped {state.skipped_count} event(s) of type(s) this agent version does not know: "
        f"{', '.join(state.skipped)}; the session state was built without them (upgrade the "
        "agent to read them)"
    )


def history(state: SessionState) -> list[dict[str, str]]:
    """The turns as `dspy.History(messages=...)` takes them, oldest first."""
    return [{"question": t.question, "answer": t.answer} for t in state.image.turns]


# -- decisions: a command's outcome as an event, never an exception ------------------------


def _refused(block: str, op: str, reason: str, message: str, length: int = 0) -> CoreMemoryRefused:
    limit = CORE_MEMORY_LIMITS.get(block, 0)
    return CoreMemoryRefused(
        block=block, op=op, reason=reason, message=message, limit=limit, length=length
    )


def _unknown_block(block: str, op: str) -> CoreMemoryRefused | None:
    if block in CORE_MEMORY_LIMITS:
        return None
    blocks = ", ".join(CORE_MEMORY_LIMITS)
    return _refused(
        block, op, "unknown_block", f"there is no core-memory block {block!r}: use one of {blocks}"
    )


def _over_limit(block: str, op: str, value: str) -> CoreMemoryRefused | None:
    limit = CORE_MEMORY_LIMITS[block]
    if len(value) <= limit:
        return None
    return _refused(
        block,
        op,
        "over_limit",
        f"core-memory block {block!r} would hold {len(value)} characters, over its limit of "
        f"{limit}: shorten the text, or replace older content in {block!r} first",
        length=len(value),
    )


def append_core_memory(
    memory: CoreMemory, block: str, text: str
) -> CoreMemoryChanged | CoreMemoryRefused:
    """Append `text` to `block` on a new line, within the block's limit."""
    refused = _unknown_block(block, "append")
    if refused is not None:
        return refused
    if not text.strip():
        return _refused(block, "append", "empty", "nothing to append: give the text to add")
    current: str = getattr(memory, block)
    value = f"{current}\n{text}" if current else text
    refused = _over_limit(block, "append", value)
    if refused is not None:
        return refused
    return CoreMemoryChanged(block=block, op="append", value=value, text=text)


def replace_core_memory(
    memory: CoreMemory, block: str, old: str, new: str
) -> CoreMemoryChanged | CoreMemoryRefused:
    """Replace the one occurrence of `old` in `block` with `new` (empty `new` deletes it).

    `old` must occur exactly once: replacing every occurrence, or the first of several, would
    change text the model did not mean, so it is asked for a longer, unique excerpt instead.
    """
    refused = _unknown_block(block, "replace")
    if refused is not None:
        return refused
    current: str = getattr(memory, block)
    if not old:
        return _refused(block, "replace", "empty", "give the exact text to replace (old)")
    count = current.count(old)
    if count == 0:
        return _refused(
            block,
            "replace",
            "not_found",
            f"{old!r} is not in core-memory block {block!r}: quote its current text exactly",
        )
    if count > 1:
        return _refused(
            block,
            "replace",
            "ambiguous",
            f"{old!r} occurs {count} times in core-memory block {block!r}: quote a longer "
            "excerpt that occurs once",
        )
    value = current.replace(old, new)  # `old` occurs exactly once
    refused = _over_limit(block, "replace", value)
    if refused is not None:
        return refused
    return CoreMemoryChanged(block=block, op="replace", value=value, text=new, old=old)


def answer_input(
    state: SessionState, request_id: str, answer: str, option: str = ""
) -> InputProvided | InputRefused:
    """An answer to the parked turn's question, or why it fits no pending request."""
    pending = state.pending_input
    if pending is None:
        return InputRefused(
            request_id=request_id,
            reason="none_pending",
            message=f"no question is waiting for an answer (request {request_id!r} was "
            "answered, expired or never asked)",
        )
    if pending.request_id != request_id:
        return InputRefused(
            request_id=request_id,
            reason="other_request",
            message=f"request {request_id!r} is not the pending one: answer "
            f"{pending.request_id!r} instead",
        )
    if option and option not in pending.options:
        return InputRefused(
            request_id=request_id,
            reason="unknown_option",
            message=f"option {option!r} was not offered: choose one of "
            f"{', '.join(map(repr, pending.options)) or '(none; answer in text)'}",
        )
    return InputProvided(request_id=request_id, answer=answer, option=option)


# -- what a turn request meets: an earlier request under its id, documents, open turns -----


def earlier_request(
    state: SessionState, event_id: str, request: TurnRequested
) -> tuple[AskedTurn, bool] | None:
    """The turn request already stored under `event_id` (None: none is) and whether `request`
    asks the same as it: the same is a retry, answered with the first; a different one under
    the same id is the client's error."""
    asked = state.requests.get(event_id)
    if asked is None:
        return None
    return asked, asked.digest == request_digest(request)


def missing_documents(state: SessionState, named: tuple[str, ...]) -> list[str]:
    """The aliases in `named` that no loaded document of the session has, in their order."""
    loaded = {d.alias for d in state.image.documents}
    return [alias for alias in named if alias not in loaded]


def active_turn(state: SessionState) -> str | None:
    """The turn a cancel without a turn id means: the latest asked that has not ended."""
    return state.open_turns[-1].turn if state.open_turns else None


def asked_turn(state: SessionState, turn: str) -> bool:
    """Whether `turn` was ever requested in the session (ended or not)."""
    return any(asked.turn == turn for asked in state.requests.values())
