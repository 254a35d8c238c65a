from collections.abc import Callable

import pytest
from nats.js import JetStreamContext

from fleet_events import Actor, Envelope, Event, new_id, streams, utc_now
from fleet_events.session import log_subject
from fleet_mesh.store import EventStore, open_store

ACTOR = Actor(service="test", replica="t-0")


def envelope(data: Event, *, tenant: str = "acme", event_id: str | None = None) -> Envelope[Event]:
    return Envelope(id=event_id or new_id(), tenant=tenant, actor=ACTOR, ts=utc_now(), data=data)


@pytest.fixture
async def store(js: JetStreamContext) -> EventStore:
    return await open_store(js, streams.SESSIONS)


@pytest.fixture
def fresh_subject() -> Callable[[], str]:
    return lambda: log_subject("acme", new_id())
