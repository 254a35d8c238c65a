from collections.abc import Callable

import pytest
from nats.js import JetStreamContext

from fleet_events import Actor, Envelope, Event, new_id, streams, utc_now
from fleet_events.binding import session_tokens
from fleet_events.session import log_subject
from fleet_mesh.store import EventStore, open_store

ACTOR = Actor(service="test", replica="t-0")


def envelope(
    data: Event, subject: str, *, tenant: str = "acme", event_id: str | None = None
) -> Envelope[Event]:
    """An event that names the session (and run) of `subject`, as every writer's events do."""
    session, run = session_tokens(subject) or (None, None)
    return Envelope(
        id=event_id or new_id(),
        tenant=tenant,
        session=session,
        run=run,
        actor=ACTOR,
        ts=utc_now(),
        data=data,
    )


@pytest.fixture
async def store(js: JetStreamContext) -> EventStore:
    return await open_store(js, streams.SESSIONS)


@pytest.fixture
def fresh_subject() -> Callable[[], str]:
    return lambda: log_subject("acme", new_id())
