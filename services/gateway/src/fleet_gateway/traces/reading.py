"""Reading what a trace is built from: a session's `.log` and every run subject under it, in
stream order, straight from the log (batched direct gets), never from a read model, so a trace
is whole the moment its events are stored and is the same on every replica.

Only the types the span tree reads are decoded (picked by the `Fleet-Type` header); an event a
newer writer added, or one whose offloaded payload is gone, is skipped, not fatal.
"""

from collections.abc import Iterable
from typing import Any

from fleet_events import Envelope, run, session
from fleet_events.binding import subject_tenant
from fleet_events.chain import TYPE_HEADER
from fleet_events.codec import Codec, CodecError
from fleet_events.envelope import Event, Offloaded
from fleet_events.ids import check_id
from fleet_mesh.store import EventStore, StoreError


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
    store: EventStore, codec: Codec, subject: str, types: frozenset[str]
) -> list[Envelope[Any]]:
    found: list[Envelope[Any]] = []
    async for raw in store.read_raw(subject):
        if raw.headers.get(TYPE_HEADER, "") not in types:
            continue
        try:
            envelope = await codec.decode(raw.data, tenant=subject_tenant(raw.subject))
        except (CodecError, StoreError, ValueError):
            continue
        if not isinstance(envelope.data, Offloaded):
            found.append(envelope)
    return found


async def session_events(
    store: EventStore, codec: Codec, tenant: str, session_id: str
) -> list[Envelope[Any]]:
    """Every trace event of the session (all its turns), in stream order."""
    return await _decoded(store, codec, session.session_filter(tenant, session_id), TRACE_TYPES)


async def run_events(
    store: EventStore, codec: Codec, tenant: str, run_id: str
) -> list[Envelope[Any]]:
    """One run's events, wherever in the tenant's sessions it ran (a run id is unique)."""
    subject = f"fleet.session.{check_id('tenant', tenant)}.*.run.{check_id('run', run_id)}"
    return await _decoded(store, codec, subject, frozenset(_tag(kind) for kind in run.EVENTS))


def turns_of(events: Iterable[Envelope[Any]]) -> list[str]:
    """The session's turns in the order they were asked (a turn with runs but no request,
    from a partial log, comes where its first event does)."""
    seen: dict[str, None] = {}
    for envelope in events:
        if envelope.turn is not None:
            seen.setdefault(envelope.turn, None)
    return list(seen)
