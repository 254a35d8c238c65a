"""Turn admission, attempts and cancels as a fold over a session's `.log`, and the decisions
read from it. Pure: no I/O, no asyncio.

One turn per session at a time, by the log's order: a `TurnRequested` is admitted when, at
its place in the log, no earlier admitted turn is still open (not completed, failed or
cancelled); otherwise it is refused. The rule reads nothing but the log, so every dispatcher
replica and every redelivery reaches the same decision, and two racing requests cannot both
start: the store serialises their appends, and the later one finds the earlier open.

Every append that acts on a decision is made against the head the decision was folded at
(optimistic concurrency): if the log moved meanwhile the caller folds again and decides again.
That is also what fences a replica that froze past its ack deadline: the replica that took the
turn over appended `TurnStarted(attempt + 1)`, so the frozen one's next append is refused and,
folded again, the turn is no longer its attempt (`finish` answers `Superseded`).
"""

from dataclasses import dataclass, field
from typing import Literal

from fleet_events import Event, InvalidId, check_id
from fleet_events.session import (
    CancelRequested,
    InputExpired,
    InputProvided,
    SessionDeleted,
    TurnCancelled,
    TurnCompleted,
    TurnFailed,
    TurnParked,
    TurnRefused,
    TurnRequested,
    TurnStarted,
)

Ended = Literal["completed", "failed", "cancelled"]

FOLDED: tuple[type[Event], ...] = (
    SessionDeleted,
    TurnRequested,
    TurnRefused,
    TurnStarted,
    CancelRequested,
    TurnCompleted,
    TurnFailed,
    TurnCancelled,
    TurnParked,
    InputProvided,
    InputExpired,
)
"""The only types this fold reads; every other event on the log is skipped unread."""


@dataclass
class Turn:
    """What the log says about one turn."""

    turn: str
    requested_seq: int
    request_id: str
    admitted: bool = False
    refusal: TurnRefused | None = None
    """Why the log's order refuses it (set when it was requested; the event may not be stored
    yet: `refusal_recorded` says whether it is)."""
    refusal_recorded: bool = False
    attempt: int = 0
    """The last attempt started (0: never started)."""
    replica: str = ""
    cancel_requested: bool = False
    cancel_reason: str = ""
    ended: Ended | None = None
    parked_on: str = ""
    """The input request the turn is parked on (no worker holds it), until it resumes."""


@dataclass
class SessionTurns:
    active: str | None = None
    """The admitted turn that has not ended yet: it blocks every other request."""
    deleted: bool = False
    turns: dict[str, Turn] = field(default_factory=dict)
    answered: set[str] = field(default_factory=set)
    """Input requests answered or expired (a parked turn resumes once its request is here,
    whichever of the answer and the park was stored first)."""


def _malformed(turn: str | None) -> TurnRefused | None:
    try:
        check_id("turn", turn or "")
    except InvalidId as exc:
        return TurnRefused(
            reason="malformed",
            message=f"{exc}; the gateway gives every TurnRequested a turn id, ask again",
        )
    return None


def turn_key(turn: str | None, event_id: str) -> str:
    """A request without a usable turn id is still a turn of the log (refused, `malformed`),
    keyed by its event id so its refusal can be recorded against it."""
    return turn if turn and _malformed(turn) is None else event_id


def evolve(
    state: SessionTurns, event: Event, *, turn: str | None, seq: int, event_id: str
) -> SessionTurns:
    """Fold one event (mutating `state`, returned for chaining)."""
    if isinstance(event, SessionDeleted):
        state.deleted = True
        return state
    if isinstance(event, InputProvided | InputExpired):
        state.answered.add(event.request_id)
        return state
    key = turn_key(turn, event_id) if isinstance(event, TurnRequested) else (turn or "")
    if isinstance(event, TurnRequested):
        if key in state.turns:
            return state  # the same turn asked twice: the first request stands
        asked = Turn(turn=key, requested_seq=seq, request_id=event_id)
        state.turns[key] = asked
        malformed = _malformed(turn)
        if malformed is not None:
            asked.refusal = malformed
        elif state.deleted:
            asked.refusal = TurnRefused(
                reason="session_deleted",
                message="this session was deleted: start a new session to ask again",
            )
        elif state.active is not None:
            asked.refusal = TurnRefused(
                reason="busy",
                message=(
                    f"session is running turn {state.active}: wait for it to end, or cancel "
                    "it, then ask again"
                ),
                active_turn=state.active,
            )
        else:
            asked.admitted = True
            state.active = key
        return state
    record = state.turns.get(key)
    if record is None:
        return state  # a fact about a turn this log never asked for: nothing to fold
    if isinstance(event, TurnRefused):
        record.refusal_recorded = True
    elif isinstance(event, TurnStarted):
        record.attempt = max(record.attempt, event.attempt)
        record.replica = event.replica
        record.parked_on = ""
    elif isinstance(event, TurnParked):
        if record.ended is None and event.attempt == record.attempt:
            record.parked_on = event.request_id
    elif isinstance(event, CancelRequested):
        if record.ended is None and not record.cancel_requested:
            record.cancel_requested = True
            record.cancel_reason = event.reason
    elif isinstance(event, TurnCompleted | TurnFailed | TurnCancelled):
        if record.ended is None:
            record.ended = (
                "completed"
                if isinstance(event, TurnCompleted)
                else "failed"
                if isinstance(event, TurnFailed)
                else "cancelled"
            )
        if state.active == key:
            state.active = None
    return state


# -- decisions: what each stores (`events`, for the decider kernel) ------------------------------


class _Stores:
    """A decision that stores its one event."""

    event: Event

    @property
    def events(self) -> tuple[Event, ...]:
        return (self.event,)


class _StoresNothing:
    @property
    def events(self) -> tuple[Event, ...]:
        return ()


# -- the dispatcher's decision ---------------------------------------------------------------


@dataclass(frozen=True)
class Dispatch(_StoresNothing):
    """Publish the turn's work item."""


@dataclass(frozen=True)
class Refuse(_Stores):
    """Record the refusal the log's order implies."""

    event: TurnRefused


@dataclass(frozen=True)
class Nothing(_StoresNothing):
    why: str


def dispatch(state: SessionTurns, turn: str) -> Dispatch | Refuse | Nothing:
    record = state.turns.get(turn)
    if record is None:
        return Nothing("the log holds no such request")
    if record.refusal is not None:
        if record.refusal_recorded:
            return Nothing("refusal already recorded")
        return Refuse(record.refusal)
    if record.ended is not None:
        return Nothing(f"turn already {record.ended}")
    if record.attempt > 0:
        # Its work item exists and is held by a replica (or awaits redelivery): a second one
        # would be a duplicate the dedup window may no longer catch.
        return Nothing("turn already started")
    return Dispatch()


def resumable(state: SessionTurns) -> list[Turn]:
    """Parked turns that can go on now (answered, expired or cancelled) and so need a resume
    work item: the dispatcher publishes one for each (deduplicated by `turn_resume_id`)."""
    return [
        t
        for t in state.turns.values()
        if t.parked_on and t.ended is None and (t.parked_on in state.answered or t.cancel_requested)
    ]


# -- the worker's decisions --------------------------------------------------------------------


@dataclass(frozen=True)
class Start(_Stores):
    event: TurnStarted
    message_seq: int


@dataclass(frozen=True)
class End(_Stores):
    """Record a terminal event without running the turn, then ack."""

    event: TurnFailed | TurnCancelled


@dataclass(frozen=True)
class Drop(_StoresNothing):
    """Ack the delivery and record nothing."""

    why: str


def poison_message(delivered: int) -> str:
    return (
        f"the turn's work item was delivered {delivered} times and never finished: the "
        "replicas running it died or timed out. It is not retried again; the agent logs of "
        "those replicas say why"
    )


def start(
    state: SessionTurns,
    turn: str,
    *,
    delivery: int,
    max_attempts: int,
    replica: str,
    restartable: bool,
) -> Start | End | Drop:
    """What a replica holding delivery number `delivery` of the turn's work item does."""
    record = state.turns.get(turn)
    if record is None or not record.admitted:
        return Drop("the log holds no admitted request for this turn")
    if record.ended is not None:
        return Drop(f"turn already {record.ended}")  # e.g. a crash after the end, before the ack
    if record.cancel_requested:
        return End(
            TurnCancelled(
                reason=record.cancel_reason, partial="", attempt=record.attempt
            )  # stopped before (or between) attempts: there is no partial answer to keep
        )
    if delivery > max_attempts:
        return End(
            TurnFailed(
                error=poison_message(delivery - 1),
                retryable=False,
                code="poison",
                attempt=record.attempt,
            )
        )
    if record.parked_on:
        if record.parked_on not in state.answered:
            return Drop(f"parked on input request {record.parked_on}: no answer yet")
        return Start(TurnStarted(replica=replica, attempt=record.attempt + 1), record.requested_seq)
    if record.attempt > 0 and delivery == 1:
        return Drop(
            f"a second work item for a turn already started (attempt {record.attempt} on "
            f"{record.replica}): the first one is still held or will be redelivered"
        )
    if record.attempt > 0 and not restartable:
        return End(
            TurnFailed(
                error=(
                    f"the replica running this turn ({record.replica}, attempt "
                    f"{record.attempt}) stopped before it ended, and this agent cannot resume "
                    "a turn part way: ask again"
                ),
                retryable=True,
                code="replica_lost",
                attempt=record.attempt,
            )
        )
    return Start(TurnStarted(replica=replica, attempt=record.attempt + 1), record.requested_seq)


@dataclass(frozen=True)
class Append(_Stores):
    event: Event


@dataclass(frozen=True)
class Superseded(_StoresNothing):
    why: str


def finish(state: SessionTurns, turn: str, *, attempt: int, event: Event) -> Append | Superseded:
    """Whether attempt `attempt` may still record how the turn ended."""
    record = state.turns.get(turn)
    if record is None:
        return Superseded("the log no longer holds this turn")
    if record.ended is not None:
        return Superseded(f"turn already {record.ended}")
    if record.attempt != attempt:
        return Superseded(
            f"attempt {record.attempt} on {record.replica} took this turn over from attempt "
            f"{attempt}"
        )
    return Append(event)
