"""Reading what a trace is built from: a session's `.log` and every run subject under it, in
stream order, straight from the log (batched direct gets), never from a read model, so a trace
is whole the moment its events are stored and is the same on every replica.

Only the types the span tree reads are decoded (picked by the `Fleet-Type` header); an event a
newer writer added, or one whose offloaded payload is gone, is skipped, not fatal.
"""

from collections.abc import AsyncIterator, Iterable
from typing import Any, Protocol

from cachetools import LRUCache

from fleet_events import Envelope, run, session, subjects
from fleet_events.binding import subject_tenant
from fleet_events.chain import TYPE_HEADER
from fleet_events.codec import Codec, CodecError
from fleet_events.envelope import Event, Offloaded
from fleet_mesh.store import EventStore, RawEvent, StoreError


class RawReader(Protocol):
    """What a trace read needs of the store (`EventStore.read_raw`)."""

    def read_raw(
        self, filter_subject: str, *, from_seq: int = 1, up_to_seq: int | None = None
    ) -> AsyncIterator[RawEvent]: ...


def _tag(kind: type[Event]) -> str:
    return str(kind.__struct_config__.tag)


_TURN_TYPES: tuple[type[Event], ...] = (
    session.TurnRequested,
    session.TurnStarted,
    session.TurnCompleted,
    session.TurnFailed,
    session.TurnCancelled,
    session.TurnRefused,
    Offloaded,
)
TRACE_TYPES = frozenset(_tag(kind) for kind in (*run.EVENTS, *_TURN_TYPES))


async def _decoded(
    store: RawReader, codec: Codec, subject: str, types: frozenset[str], *, from_seq: int = 1
) -> tuple[list[Envelope[Any]], int]:
    """The matching events from `from_seq` on, and the last sequence read (0: none)."""
    found: list[Envelope[Any]] = []
    last = 0
    async for raw in store.read_raw(subject, from_seq=from_seq):
        last = raw.seq
        if raw.headers.get(TYPE_HEADER, "") not in types:
            continue
        try:
            envelope = await codec.decode(raw.data, tenant=subject_tenant(raw.subject))
        except (CodecError, StoreError, ValueError):
            continue
        if not isinstance(envelope.data, Offloaded):
            found.append(envelope)
    return found, last


async def session_events(
    store: EventStore, codec: Codec, tenant: str, session_id: str
) -> list[Envelope[Any]]:
    """Every trace event of the session (all its turns), in stream order."""
    subject = session.session_filter(tenant, session_id)
    return (await _decoded(store, codec, subject, TRACE_TYPES))[0]


Held = tuple[int, list[Envelope[Any]]]
"""A session's last sequence read and its trace events up to it."""


def _events_held(held: Held) -> int:
    return len(held[1])


class SessionCache:
    """The trace events of recently read sessions, each with the last sequence read, so the
    next read of a session asks only for what was stored since (a tail: one round trip when
    nothing changed). The log is append-only, so what was read stays true. Bounded by events
    held over all sessions (`cachetools.LRUCache` sized by events): the least recently read
    session goes first; a session larger than the whole bound is read and not kept. Per
    replica."""

    def __init__(self, max_events: int = 50_000) -> None:
        self.max_events = max_events
        self._held: LRUCache[tuple[str, str], Held] = LRUCache(max_events, _events_held)

    async def events(
        self, store: RawReader, codec: Codec, tenant: str, session_id: str
    ) -> list[Envelope[Any]]:
        key = (tenant, session_id)
        last, held = self._held.get(key, (0, []))
        subject = session.session_filter(tenant, session_id)
        new, read_to = await _decoded(store, codec, subject, TRACE_TYPES, from_seq=last + 1)
        events = held + new if new else held
        raced = self._held.get(key)  # a concurrent read of the same session stored more
        if raced is not None and raced[0] > max(last, read_to):
            return raced[1]
        if len(events) <= self.max_events:
            self._held[key] = (max(last, read_to), events)
        else:
            self._held.pop(key, None)
        return events


async def run_events(
    store: EventStore, codec: Codec, tenant: str, run_id: str
) -> list[Envelope[Any]]:
    """One run's events, wherever in the tenant's sessions it ran (a run id is unique)."""
    subject = subjects.SESSION_RUN.filter(tenant=tenant, run=run_id)
    types = frozenset(_tag(kind) for kind in run.EVENTS)
    return (await _decoded(store, codec, subject, types))[0]


def by_turn(events: Iterable[Envelope[Any]]) -> dict[str, list[Envelope[Any]]]:
    """The session's events grouped by turn, in one pass, for the turns a `turn.requested`
    asked (in the order their first event came); each group in stream order."""
    groups: dict[str, list[Envelope[Any]]] = {}
    asked: set[str] = set()
    for envelope in events:
        if envelope.turn is None:
            continue
        groups.setdefault(envelope.turn, []).append(envelope)
        if isinstance(envelope.data, session.TurnRequested):
            asked.add(envelope.turn)
    return {turn: group for turn, group in groups.items() if turn in asked}
