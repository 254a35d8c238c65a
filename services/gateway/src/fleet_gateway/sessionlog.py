"""The gateway's handles on the session log: the store, the blobs and the codec, opened once per
bus connection, and the one append every client write goes through.

A client write is a fact on the session's `.log` with the caller's tenant (from its token or
ticket, never from its input). The first write to a session that has none yet opens it with
`SessionCreated` in the same atomic batch, so a log never starts with anything else.
"""

from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client
from starlette.requests import HTTPConnection

from fleet_events import Actor, Envelope, Event, new_id, streams, utc_now
from fleet_events.codec import Codec
from fleet_events.ids import InvalidId, check_id
from fleet_events.session import SessionCreated, log_subject
from fleet_gateway.errors import ApiError, not_found
from fleet_gateway.live import Hub
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.store import EMPTY, AppendConflict, EventStore, open_store

APPEND_TRIES = 20


def checked_session(value: str) -> str:
    """A session id from a path, or 422 saying what is wrong with it."""
    try:
        return check_id("session", value)
    except InvalidId as exc:
        raise ApiError(
            422, "invalid_session_id", f"{exc}; use letters, digits, '_' or '-'"
        ) from exc


@dataclass
class SessionLog:
    nc: Client
    store: EventStore
    blobs: JetStreamBlobs
    codec: Codec
    replica: str
    hub: Hub

    def envelope(
        self, tenant: str, session: str, data: Event, *, turn: str | None = None,
        event_id: str | None = None,
    ) -> Envelope[Any]:  # fmt: skip
        return Envelope(
            id=event_id or new_id(), tenant=tenant, session=session, turn=turn,
            actor=Actor(service="gateway", replica=self.replica), ts=utc_now(), data=data,
        )  # fmt: skip

    async def write(
        self, tenant: str, session: str, data: Event, *, turn: str | None = None,
        event_id: str | None = None, create: bool = True,
    ) -> tuple[int, int]:  # fmt: skip
        """Append `data` to the session's log: (the sequence of the first event written, the
        one `data` got); they differ when this write opened the session. A retry with the
        same `event_id` answers the original sequence."""
        subject = log_subject(tenant, session)
        event = self.envelope(tenant, session, data, turn=turn, event_id=event_id)
        for _ in range(APPEND_TRIES):
            head = await self.store.head(subject)
            try:
                if head == EMPTY and not create:
                    raise not_found("session", session)
                if head == EMPTY:
                    opened = self.envelope(tenant, session, SessionCreated())
                    done = await self.store.append_batch(subject, [opened, event], expect=EMPTY)
                    return done[0].seq, done[-1].seq
                seq = (await self.store.append(subject, event, expect=head)).seq
                return seq, seq
            except AppendConflict:
                continue
        raise ApiError(
            503, "log_busy", f"session {session!r} kept moving under {APPEND_TRIES} tries; retry"
        )


async def session_log(connection: HTTPConnection) -> SessionLog:
    """The handles of this app's current bus connection (opened on first use)."""
    state = connection.app.state.gateway
    nc: Client | None = state.nc
    if nc is None or not nc.is_connected:
        raise ApiError(503, "nats_unavailable", "the gateway has no bus connection; retry shortly")
    cached: SessionLog | None = getattr(connection.app.state, "session_log", None)
    if cached is None or cached.nc is not nc:
        js = nc.jetstream()
        blobs = await JetStreamBlobs.open(js)
        store, codec = await open_store(js, streams.SESSIONS), Codec(blobs)
        cached = SessionLog(
            nc=nc, store=store, blobs=blobs, codec=codec, replica=state.replica,
            hub=Hub(nc, blobs, codec, store),
        )  # fmt: skip
        connection.app.state.session_log = cached
    return cached
