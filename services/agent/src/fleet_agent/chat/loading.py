"""What a chat turn reads before it runs, on the bus loop: the session's fold, the turn's
request and the context it names, and for a later attempt where its run stands (parked on a
question, or left by a holder that died).
"""

import logging
from dataclasses import dataclass, field

from fleet_agent.chat.resume import Crashed, Resume, answer_text, crashed, rebuild
from fleet_agent.chat.tools.kit import Logged
from fleet_agent.chat.turn_context import read_context
from fleet_agent.engine.model import EngineMesh, root_run_id
from fleet_agent.lenient import LenientCodec
from fleet_agent.runners import TurnInput
from fleet_events import Event, streams
from fleet_events import journal as jr
from fleet_events.run import RunStarted, ToolReturned
from fleet_events.session import (
    InputExpired,
    InputProvided,
    InputRequested,
    TurnParked,
    TurnRequested,
    log_subject,
    run_subject,
)
from fleet_events.session_fold import FOLD, SessionState, skipped_line
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.store import EMPTY, EventStore, Head

log = logging.getLogger("fleet.agent.chat")


async def load_session(mesh: EngineMesh, turn: TurnInput) -> tuple[SessionState, str]:
    """The session's fold and the turn's mode, in one pass over its log (on the bus loop)."""
    state, request, _ = await load_turn(mesh, turn)
    return state, request.mode if request is not None else "auto"


async def load_turn(
    mesh: EngineMesh, turn: TurnInput, max_chars: int | None = None
) -> tuple[SessionState, TurnRequested | None, str]:
    """The session's fold, the turn's request and the context it names (`turn_context`), in
    one pass over its log (on the bus loop).

    Only the `.log` subject is read: the fold leaves run steps alone (docs/agent.md), so the
    state is the one the whole session filter gives, without reading every model call of
    every earlier turn (the test of restore folds the whole filter and compares)."""
    js = mesh.bus.nc.jetstream()
    blobs = await JetStreamBlobs.open(js)
    store = EventStore(js, streams.SESSIONS, LenientCodec(blobs))
    state = FOLD.initial()
    request: TurnRequested | None = None
    async for stored in store.replay(log_subject(turn.tenant, turn.session)):
        state = FOLD.evolve(state, stored)
        data = stored.envelope.data
        if isinstance(data, TurnRequested) and stored.envelope.turn == turn.turn:
            request = request or data  # the same turn asked twice: the first request stands
    line = skipped_line(state)
    if line is not None:
        log.warning(line, extra={"session": turn.session})
    documents = {d.alias: d for d in state.image.documents}
    context = await read_context(blobs, turn.tenant, request, documents, max_chars=max_chars)
    return state, request, context


async def load_resume(mesh: EngineMesh, turn: TurnInput, timeout_s: float) -> "Started | None":
    """Where a parked turn's run stands (on the bus loop): its record, its head, and the
    answer to the question it parked on, read from the log."""
    run = root_run_id(turn.tenant, turn.session, turn.turn)
    subject = run_subject(turn.tenant, turn.session, run)
    events = [stored.envelope.data async for stored in mesh.store.replay(subject)]
    head = await mesh.store.head(subject)
    js = mesh.bus.nc.jetstream()
    lenient = EventStore(js, streams.SESSIONS, LenientCodec(await JetStreamBlobs.open(js)))
    asked: InputRequested | None = None
    answers: dict[str, InputProvided | InputExpired] = {}
    parked: set[str] = set()
    async for stored in lenient.replay(log_subject(turn.tenant, turn.session)):
        data = stored.envelope.data
        if isinstance(data, InputRequested) and stored.envelope.run == run:
            asked = data
        elif isinstance(data, InputProvided | InputExpired):
            answers[data.request_id] = data
        elif isinstance(data, TurnParked) and stored.envelope.turn == turn.turn:
            parked.add(data.request_id)
    if asked is None or asked.request_id not in parked:
        # not parked on it: a holder that died waiting in the turn (or before it parked)
        # left the question in flight, and the takeover asks it again (`load_crashed`)
        return None
    result, error = answer_text(answers.get(asked.request_id), timeout_s)
    point = rebuild(events, result)
    return None if point is None else Started(point, head, result, error)


@dataclass(frozen=True)
class Taken:
    """A run whose holder died (a redelivered attempt, not a parked one): its record folded,
    the head the next append is made against, and where it stands (None: it had ended)."""

    events: list[Event]
    journal: jr.Journal
    head: Head
    point: Crashed | None
    facts: dict[str, Logged[Event]] = field(default_factory=dict)
    """The session facts the run's tool calls stored, by envelope id (`tools.kit.fact_id`)."""

    @property
    def returned(self) -> dict[str, ToolReturned]:
        """The tool results the record holds, by call id."""
        return {e.call_id: e for e in self.events if isinstance(e, ToolReturned)}


async def load_crashed(mesh: EngineMesh, turn: TurnInput) -> Taken | None:
    """The record of a turn's run left by a holder that died (on the bus loop); None when
    the dead holder recorded no `run.started` (the turn then runs from the start)."""
    run = root_run_id(turn.tenant, turn.session, turn.turn)
    journal = jr.Journal()
    events: list[Event] = []
    head = EMPTY
    async for stored in mesh.store.replay(run_subject(turn.tenant, turn.session, run)):
        events.append(stored.envelope.data)
        jr.evolve(journal, stored.envelope.data)
        head = Head(stored.seq, stored.hash)
    if not events or not isinstance(events[0], RunStarted):
        return None
    js = mesh.bus.nc.jetstream()
    lenient = EventStore(js, streams.SESSIONS, LenientCodec(await JetStreamBlobs.open(js)))
    facts: dict[str, Logged[Event]] = {}
    async for stored in lenient.replay(log_subject(turn.tenant, turn.session)):
        envelope = stored.envelope
        if envelope.run == run and envelope.causation:
            facts[envelope.id] = Logged(stored.seq, envelope.data)
    return Taken(events, journal, head, crashed(events), facts)


@dataclass(frozen=True)
class Started:
    """A resumed run: where its record ends and what the parked call returns."""

    point: Resume
    head: Head
    result: str
    error: str


__all__ = ["Started", "Taken", "load_crashed", "load_resume", "load_session", "load_turn"]
