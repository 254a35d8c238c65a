"""The session log as the dispatcher and the worker read and write it: the turn fold, the
requested message, and appends made against the head a decision was folded at.

Only the turn-lifecycle types are decoded (picked by their `Fleet-Type` header): an event type
this replica does not know, written by a newer one, is skipped, and said so once per type,
instead of stopping every turn of the session (issue 9, item 9).
"""

import logging
from typing import Any

from fleet_agent.turns import FOLDED, SessionTurns, evolve
from fleet_events import Actor, Envelope, Event, new_id, utc_now
from fleet_events.catalog import BY_TAG, type_of_class
from fleet_events.chain import HASH_HEADER, TYPE_HEADER
from fleet_events.codec import Codec
from fleet_events.session import TurnRequested, log_subject
from fleet_mesh.store import EMPTY, Appended, EventStore, Head

log = logging.getLogger("fleet.agent.turns")

FOLDED_TYPES = frozenset(type_of_class(cls) for cls in FOLDED)


class TurnLog:
    def __init__(self, store: EventStore, codec: Codec, actor: Actor) -> None:
        self._store = store
        self._codec = codec
        self._actor = actor
        self._unknown_seen: set[str] = set()

    async def load(self, tenant: str, session: str) -> tuple[SessionTurns, Head]:
        """The turn fold of the whole log, and the head it was folded at."""
        subject = log_subject(tenant, session)
        state = SessionTurns()
        head = EMPTY
        async for raw in self._store.read_raw(subject):
            head = Head(raw.seq, raw.headers.get(HASH_HEADER, ""))
            kind = raw.headers.get(TYPE_HEADER, "")
            if kind not in FOLDED_TYPES:
                if kind not in BY_TAG:
                    self._note_unknown(kind, subject)
                continue
            envelope = await self._codec.decode(raw.data, tenant=tenant)
            evolve(state, envelope.data, turn=envelope.turn, seq=raw.seq, event_id=envelope.id)
        return state, head

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
        return await self._store.append(log_subject(tenant, session), envelope, expect=expect)
