"""The session log as the dispatcher and the worker read and write it: the turn fold, the
requested message, and appends made against the head a decision was folded at.

Only the turn-lifecycle types are decoded (picked by their `Fleet-Type` header): an event type
this replica does not know, written by a newer one, is skipped, and said so once per type,
instead of stopping every turn of the session (issue 9, item 9).
"""

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from fleet_agent.turns import FOLDED, SessionTurns, evolve
from fleet_events import Actor, Envelope, Event, new_id, utc_now
from fleet_events.catalog import type_of_class
from fleet_events.codec import Codec
from fleet_events.session import TurnRequested, log_subject
from fleet_mesh.decider import Decided, Decider, Ledger
from fleet_mesh.store import AppendConflict, Appended, EventStore, Head, StoredEvent

D = TypeVar("D", bound=Decided)

CACHED_LOGS = 1024


def _copy(state: SessionTurns) -> SessionTurns:
    """The fold mutates its state: a copy for a caller that keeps it, or a group commit."""
    turns = {key: dataclasses.replace(turn) for key, turn in state.turns.items()}
    return SessionTurns(
        active=state.active, deleted=state.deleted, turns=turns, answered=set(state.answered)
    )


def _fold(state: SessionTurns, stored: StoredEvent) -> SessionTurns:
    envelope = stored.envelope
    return evolve(state, envelope.data, turn=envelope.turn, seq=stored.seq, event_id=envelope.id)


TURNS = Ledger(
    name="agent-turns",
    initial=SessionTurns,
    evolve=_fold,
    clone=_copy,
    types=frozenset(type_of_class(cls) for cls in FOLDED),
)
"""Only the turn-lifecycle types are decoded: an event type this replica does not know,
written by a newer one, is skipped (said once per type) instead of stopping every turn."""


class TurnLog:
    """Folds are kept per log subject (the last `CACHED_LOGS` used, by the decider kernel), so
    a load reads only the events stored since the last one, in one round trip: reading a whole
    log on every dispatch and every start grew with the session (95 ms p50 at a few hundred
    turns, bench/turns.py --one-session) and logs only ever grow."""

    def __init__(self, store: EventStore, codec: Codec, actor: Actor) -> None:
        self._store = store
        self._codec = codec
        self._actor = actor
        self._logs = Decider(store, TURNS, capacity=CACHED_LOGS, attempts=32)

    async def load(self, tenant: str, session: str) -> tuple[SessionTurns, Head]:
        """The turn fold of the whole log (a copy the caller may keep), and its head."""
        cached = await self._logs.current(log_subject(tenant, session), fresh=True)
        return _copy(cached.state), cached.head

    async def submit(
        self,
        tenant: str,
        session: str,
        decide: Callable[[SessionTurns], D],
        *,
        about: Callable[[SessionTurns], tuple[str, str | None]],
    ) -> D:
        """Decide on the log's fold, read to its head, and store what the decision stores
        (`decide(state).events`); a lost race folds again and decides again (the kernel).
        `about(state)`: the turn the events are about, and the event that caused them."""

        def wrap(state: SessionTurns, event: Event) -> Envelope[Event]:
            return self._envelope(tenant, session, *about(state), event)

        return await self._logs.submit(log_subject(tenant, session), decide, wrap, fresh=True)

    def forget(self, tenant: str, session: str) -> None:
        """Drop a cached fold (its log was purged: the next load folds from the start)."""
        self._logs.forget(log_subject(tenant, session))

    async def requested(self, tenant: str, session: str, seq: int) -> Envelope[TurnRequested]:
        """The `TurnRequested` stored at `seq` (its message may be offloaded: decoded in full)."""
        subject = log_subject(tenant, session)
        async for raw in self._store.read_raw(subject, from_seq=seq, up_to_seq=seq):
            envelope: Envelope[Any] = await self._codec.decode(raw.data, tenant=tenant)
            if isinstance(envelope.data, TurnRequested):
                return envelope
        raise LookupError(f"no TurnRequested at sequence {seq} of {subject}")

    async def append(
        self, tenant: str, session: str, turn: str, event: Event, *, expect: Head
    ) -> Appended:
        """One append after `expect`, no re-deciding: for a writer that must stop when the log
        moved (a takeover's fence)."""
        envelope = self._envelope(tenant, session, turn, None, event)
        try:
            return await self._store.append(log_subject(tenant, session), envelope, expect=expect)
        except AppendConflict as exc:
            if exc.actual is not None and exc.actual < expect.seq:
                self.forget(tenant, session)  # the log ends before our fold's head: purged
            raise

    def _envelope(
        self, tenant: str, session: str, turn: str, causation: str | None, event: Event
    ) -> Envelope[Event]:
        return Envelope(
            id=new_id(), tenant=tenant, session=session, turn=turn, actor=self._actor,
            ts=utc_now(), data=event, causation=causation, correlation=turn,
        )  # fmt: skip
