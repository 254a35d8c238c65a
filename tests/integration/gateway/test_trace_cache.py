"""The gateway's cache of sessions' trace events on a real nats-server: a second read asks only
for what was stored since the first and answers what a fresh read would; tenants and sessions
never share an entry; the least recently read session is dropped past the bound."""

from collections.abc import AsyncIterator
from typing import Any

from nats.js import JetStreamContext

from fleet_events import Actor, Envelope, Event, new_id, streams, utc_now
from fleet_events.codec import Codec
from fleet_events.run import RunStarted
from fleet_events.session import TurnRequested, log_subject, run_subject
from fleet_gateway.traces import reading
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.store import EventStore, RawEvent, open_store

ACTOR = Actor(service="test", replica="t")


async def _append(store: EventStore, subject: str, tenant: str, session: str, data: Event) -> None:
    envelope: Envelope[Any] = Envelope(
        id=new_id(), tenant=tenant, session=session, turn="turn", actor=ACTOR, ts=utc_now(),
        data=data, run=None if subject.endswith(".log") else "r1",
    )  # fmt: skip
    await store.append(subject, envelope)


class CountingStore:
    """The real store, counting what each read asks for (its `from_seq`)."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self.asked: list[int] = []

    def read_raw(
        self, filter_subject: str, *, from_seq: int = 1, up_to_seq: int | None = None
    ) -> AsyncIterator[RawEvent]:
        self.asked.append(from_seq)
        return self.store.read_raw(filter_subject, from_seq=from_seq, up_to_seq=up_to_seq)


async def test_a_second_read_is_a_tail_and_equals_a_fresh_read(js: JetStreamContext) -> None:
    store = await open_store(js, streams.SESSIONS)
    codec = Codec(await JetStreamBlobs.open(js))
    tenant, other, session = f"t{new_id()[:8]}", f"t{new_id()[:8]}", new_id()
    log = log_subject(tenant, session)
    await _append(store, log, tenant, session, TurnRequested(message="one"))
    await _append(store, log_subject(other, session), other, session, TurnRequested(message="x"))
    counting = CountingStore(store)
    cache = reading.SessionCache()
    first = await cache.events(counting, codec, tenant, session)
    assert [e.data.message for e in first] == ["one"]
    await _append(store, run_subject(tenant, session, "r1"), tenant, session,
                  RunStarted(kind="rlm", tree="t"))  # fmt: skip
    second = await cache.events(counting, codec, tenant, session)
    fresh = await reading.session_events(store, codec, tenant, session)
    assert [e.id for e in second] == [e.id for e in fresh]
    assert len(second) == 2
    assert counting.asked[0] == 1, counting.asked
    assert counting.asked[1] > 1, counting.asked
    theirs = await cache.events(counting, codec, other, session)
    assert [e.data.message for e in theirs] == ["x"]


async def test_past_the_bound_the_least_recently_read_session_goes(js: JetStreamContext) -> None:
    store = await open_store(js, streams.SESSIONS)
    codec = Codec(await JetStreamBlobs.open(js))
    tenant = f"t{new_id()[:8]}"
    sessions = [new_id() for _ in range(3)]
    for session in sessions:
        for k in range(2):
            await _append(store, log_subject(tenant, session), tenant, session,
                          TurnRequested(message=str(k)))  # fmt: skip
    counting = CountingStore(store)
    cache = reading.SessionCache(max_events=4)
    for session in sessions:
        await cache.events(counting, codec, tenant, session)
    counting.asked.clear()
    await cache.events(counting, codec, tenant, sessions[2])
    await cache.events(counting, codec, tenant, sessions[0])
    assert counting.asked[0] > 1, "the most recent session was dropped"
    assert counting.asked[1] == 1, "the oldest session was kept past the bound"
