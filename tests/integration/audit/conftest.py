"""Audit tests: stores that sign as two services would, and the key set an auditor pins."""

from collections.abc import AsyncIterator

import pytest
from nats.js import JetStreamContext

from fleet_events import Actor, Envelope, Event, new_id, streams, utc_now
from fleet_events.binding import session_tokens
from fleet_events.signing import CHECKPOINT, KeySet, Signer
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.connection import connect
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.store import EventStore, open_store

ACTOR = Actor(service="agent", replica="a-0")


def envelope(data: Event, subject: str, *, event_id: str | None = None) -> Envelope[Event]:
    session, run = session_tokens(subject) or (None, None)
    return Envelope(
        id=event_id or new_id(), tenant="acme", session=session, run=run, actor=ACTOR,
        ts=utc_now(), data=data,
    )  # fmt: skip


@pytest.fixture(scope="session")
def agent_key() -> Signer:
    return Signer.generate("agent")


@pytest.fixture(scope="session")
def gateway_key() -> Signer:
    return Signer.generate("gateway")


@pytest.fixture(scope="session")
def checkpoint_key() -> Signer:
    return Signer.generate("checkpointer", CHECKPOINT)


@pytest.fixture(scope="session")
def pinned(agent_key: Signer, gateway_key: Signer, checkpoint_key: Signer) -> KeySet:
    """What `fleet up` writes to keys/keyset.json and an auditor pins."""
    return KeySet.of([agent_key, gateway_key, checkpoint_key], require_signatures=True)


@pytest.fixture
async def agent_store(js: JetStreamContext, agent_key: Signer) -> EventStore:
    return await open_store(js, streams.SESSIONS, signer=agent_key)


@pytest.fixture
async def private_js(private_nats: NatsServer) -> AsyncIterator[JetStreamContext]:
    """A server of the test's own: the checkpointer reads the whole stream, and the shared
    server's stream holds every other test's (unsigned) events."""
    nc = await connect(private_nats.url, name="audit-test")
    js = nc.jetstream()
    await bootstrap(js)
    yield js
    await nc.close()
