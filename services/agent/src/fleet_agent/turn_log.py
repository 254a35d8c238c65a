"""The session log as the dispatcher and the worker read and write it: the turn fold, the
requested message, and appends made against the head a decision was folded at.

Only the turn-lifecycle types are decoded (picked by their `Fleet-Type` header): an event type
this replica does not know, written by a newer one, is skipped, and said so once per type,
instead of stopping every turn of the session (issue 9, item 9).
"""

import dataclasses
import logging
from collections import OrderedDict
from typing import Any

from fleet_agent.turns import FOLDED, SessionTurns, evolve
from fleet_events import Actor, Envelope, Event, new_id, utc_now
from fleet_events.catalog import BY_TAG, type_of_class
from fleet_events.chain import HASH_HEADER, PREV_HEADER, TYPE_HEADER
from fleet_events.codec import Codec
from fleet_events.session import TurnRequested, log_subject
from fleet_mesh.store import EMPTY, AppendConflict, Appended, EventStore, Head
from fleet_mesh.store.reads import NO_LIMIT

log = logging.getLogger("fleet.agent.turns")

FOLDED_TYPES = frozenset(type_of_class(cls) for cls in FOLDED)


CACHED_LOGS = 1024


def _copy(state: SessionTurns) -> SessionTurns:
    """The fold mutates its state: a cached one is copied before a tail is folded into it."""
    turns = {key: dataclasses.replace(turn) for key, turn in state.turns.items()}
    return SessionTurns(
        active=state.active, deleted=state.deleted, turns=turns, answered=set(state.answered)
    )


class TurnLog:
    """Folds are kept per log subject (the last `CACHED_LOGS` used), so a load reads only the
    events stored since the last one, in one round trip: reading a whole log on every dispatch
    and every start grew with the session (95 ms p50 at a few hundred turns, bench/turns.py
    --one-session) and logs only ever grow."""

    def __init__(self, store: EventStore, codec: Codec, actor: Actor) -> None:
        self._store = store
        self._codec = codec
        self._actor = actor
        self._unknown_seen: set[str] = set()
        self._folds: OrderedDict[str, tuple[SessionTurns, Head]] = OrderedDict()

    async def load(self, tenant: str, session: str) -> tuple[SessionTurns, Head]:
        """The turn fold of the whole log, and the head it was folded at."""
        subject = log_subject(tenant, session)
        cached = self._folds.get(subject)
        state, head = (_copy(cached[0]), cached[1]) if cached else (SessionTurns(), EMPTY)
        tail = self._store.read_raw(subject, from_seq=head.seq + 1, up_to_seq=NO_LIMIT)
        async for raw in tail:
            if cached is not None and raw.headers.get(PREV_HEADER) != head.hash:
                # The tail does not chain from the fold's head: the log was purged (and begun
                # again) since. Fold it from the start.
                self.forget(tenant, session)
                return await self.load(tenant, session)
            cached = None
            head = Head(raw.seq, raw.headers.get(HASH_HEADER, ""))
            kind = raw.headers.get(TYPE_HEADER, "")
            if kind not in FOLDED_TYPES:
                if kind not in BY_TAG:
                    self._note_unknown(kind, subject)
                continue
            envelope = await self._codec.decode(raw.data, tenant=tenant)
            evolve(state, envelope.data, turn=envelope.turn, seq=raw.seq, event_id=envelope.id)
        latest = self._folds.get(subject)
        if latest is None or latest[1].seq <= head.seq:
            self._folds[subject] = (state, head)  # callers only read what load returns
            self._folds.move_to_end(subject)
            while len(self._folds) > CACHED_LOGS:
                self._folds.popitem(last=False)
        return state, head

    def forget(self, tenant: str, session: str) -> None:
        """Drop a cached fold (its log was purged: the next load folds from the start)."""
        self._folds.pop(log_subject(tenant, session), None)

    def _note_unknown(self, kind: str, subject: str) -> None:
        if kind not in self._unknown_seen:
            self._unknown_seen.add(kind)
            log.warning(
                "skipping an event type this replica does not fold",
                extra={"type": kind, "subject": subject},
            )

    async def requested(self, tenant: str, session: str, seq: int) -> Envelope[TurnRequested]:
        """The `TurnRequested` stored at `seq` (its message may be offloaded: decoded in full)."""
        subject = log_subject(tenant, session)
        async for raw in self._store.read_raw(subject, from_seq=seq, up_to_seq=seq):
            envelope: Envelope[Any] = await self._codec.decode(raw.data, tenant=tenant)
            if isinstance(envelope.data, TurnRequested):
                return envelope
        raise LookupError(f"no TurnRequested at sequence {seq} of {subject}")

    async def append(
        self,
        tenant: str,
        session: str,
        turn: str,
        event: Event,
        *,
        expect: Head,
        causation: str | None = None,
    ) -> Appended:
        envelope = Envelope(
            id=new_id(),
            tenant=tenant,
            session=session,
            turn=turn,
            actor=self._actor,
            ts=utc_now(),
            data=event,
            causation=causation,
            correlation=turn,
        )
        try:
            return await self._store.append(log_subject(tenant, session), envelope, expect=expect)
        except AppendConflict as exc:
            if exc.actual is not None and exc.actual < expect.seq:
                self.forget(tenant, session)  # the log ends before our fold's head: purged
            raise
