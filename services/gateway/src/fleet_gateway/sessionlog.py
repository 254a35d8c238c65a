"""The gateway's one writer to session logs, and the handles it writes with: the store, the
blobs and the codec, opened once per bus connection (`components`).

Every client write (HTTP routes, WebSocket frames, uploads, imports) is a fact on the
session's `.log` with the caller's tenant (from its token or ticket, never from its input),
this replica as the actor, and answers the stream sequence it was stored at, which a later
read on any replica passes as `min_seq`. `append_event` (`SessionLog.append`) is the only
append:

- `new_session=True`: the log must not exist yet (create; a race is `SessionExists`);
- `create=True`: a session with no log yet is opened with `SessionCreated` in the same atomic
  batch (a WebSocket `message` to a new session id), so a log never starts with anything else;
- neither opens a session whose id was purged (its `.run.purge` subject holds the
  `session.purged` marker): `SessionPurged`, which reads as not found, saying the id was
  purged and cannot be reused; nothing is stored;
- otherwise the log must exist: no head in the caller's tenant is `SessionNotFound`, the same
  as another tenant's session. The log, not a projection, decides, so a session created on
  another replica a moment ago exists here;
- with `check`, each try folds the log (`fleet_events.session_fold`) and asks `check` first:
  it may answer with a turn request already stored (a retry: nothing is written) or raise
  the domain error that declines the write.

A race with another writer (the head moved) is retried, re-folding and re-checking: the
event's place after the other one changes nothing it means. The envelope (and its id) is made
once, so a retry after a lost acknowledgement is deduplicated by the store, never stored twice.
Every refusal is a domain error (`fleet_gateway.sessions.errors`); each door says it its way.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client
from starlette.requests import HTTPConnection

from fleet_events import Actor, Envelope, Event, new_id, utc_now
from fleet_events.codec import Codec
from fleet_events.ids import InvalidId, check_id
from fleet_events.session import SessionCreated, log_subject, run_subject
from fleet_events.session_fold import FOLD, AskedTurn, SessionState
from fleet_gateway.errors import ApiError
from fleet_gateway.live import Hub
from fleet_gateway.sessions.errors import LogBusy, SessionExists, SessionNotFound, SessionPurged
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.store import EMPTY, AppendConflict, EventStore, Head

Check = Callable[[SessionState], AskedTurn | None]
"""Asked of the folded log before a write: an earlier request to answer instead, or None to
write; a domain error to decline."""

APPEND_TRIES = 20
PURGE_RUN = "purge"
"""The run whose subject holds a purged session's `session.purged` marker (`routes.sessions`)."""


def checked_session(value: str) -> str:
    """A session id from a path, or 422 saying what is wrong with it."""
    try:
        return check_id("session", value)
    except InvalidId as exc:
        raise ApiError(
            422, "invalid_session_id", f"{exc}; use letters, digits, '_' or '-'"
        ) from exc


async def log_head(store: EventStore, tenant: str, session: str) -> Head:
    """The session log's head, or `SessionNotFound` when the tenant has no such session."""
    head = await store.head(log_subject(tenant, session))
    if head == EMPTY or head.seq == 0:
        raise SessionNotFound(session)
    return head


async def folded(store: EventStore, tenant: str, session: str) -> tuple[SessionState, Head]:
    """The session's state folded from its own `.log` (so a write the projections have not
    applied yet counts), and the log's head as of that fold."""
    subject = log_subject(tenant, session)
    loaded = await store.load(subject, FOLD, use_snapshot=False)
    return loaded.state, loaded.heads.get(subject, EMPTY)


async def refuse_purged(store: EventStore, tenant: str, session: str) -> None:
    """`SessionPurged` when the session's id was purged: a purged id is never opened again."""
    head = await store.head(run_subject(tenant, session, PURGE_RUN))
    if head != EMPTY and head.seq > 0:
        raise SessionPurged(session)


@dataclass(frozen=True, slots=True)
class Appended:
    first_seq: int
    """The sequence of the first event written: `SessionCreated` when this write opened the
    session, else the event's own."""
    seq: int
    envelope: Envelope[Any]


async def append_event(
    store: EventStore, actor: Actor, tenant: str, session: str, data: Event, *,
    turn: str | None = None, event_id: str | None = None, create: bool = False,
    new_session: bool = False, check: Check | None = None, **fields: Any,
) -> Appended | AskedTurn:  # fmt: skip
    """The one append of a client's write to a session's `.log` (the module's rules);
    `fields` are further envelope fields (`run`, ...). Answers what was written, or with
    `check`, the earlier request it answered instead."""
    subject = log_subject(tenant, session)

    def envelope(body: Event) -> Envelope[Any]:
        return Envelope(
            id=new_id(), tenant=tenant, session=session, actor=actor, ts=utc_now(), data=body
        )

    event: Envelope[Any] = Envelope(
        id=event_id or new_id(), tenant=tenant, session=session, turn=turn, actor=actor,
        ts=utc_now(), data=data, **fields,
    )  # fmt: skip
    checked_purge = False
    for _ in range(APPEND_TRIES):
        if new_session:
            head = EMPTY
        elif check is not None:
            state, head = await folded(store, tenant, session)
        else:
            head = await store.head(subject)
        if head == EMPTY and (create or new_session) and not checked_purge:
            await refuse_purged(store, tenant, session)  # once: a purge is for good
            checked_purge = True
        if head == EMPTY and not (create or new_session):
            raise SessionNotFound(session)
        if check is not None and not new_session:
            earlier = check(state)
            if earlier is not None:
                return earlier
        try:
            if head == EMPTY and new_session:
                seq = (await store.append(subject, event, expect=EMPTY)).seq
                return Appended(seq, seq, event)
            if head == EMPTY:
                opened = envelope(SessionCreated())
                done = await store.append_batch(subject, [opened, event], expect=EMPTY)
                return Appended(done[0].seq, done[-1].seq, event)
            seq = (await store.append(subject, event, expect=head)).seq
            return Appended(seq, seq, event)
        except AppendConflict:
            if new_session:
                raise SessionExists(session) from None
            continue
    raise LogBusy(session, APPEND_TRIES)


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

    async def append(
        self, tenant: str, session: str, data: Event, *, turn: str | None = None,
        event_id: str | None = None, create: bool = False, new_session: bool = False,
    ) -> Appended:  # fmt: skip
        """Append `data` to the session's `.log` (see the module's rules for `create` and
        `new_session`). A retry with the same `event_id` answers the original sequence."""
        done = await append_event(
            self.store, self.actor, tenant, session, data,
            turn=turn, event_id=event_id, create=create, new_session=new_session,
        )  # fmt: skip
        assert isinstance(done, Appended)  # no `check`: it never answers an earlier request
        return done

    async def write(
        self, tenant: str, session: str, data: Event, *, turn: str | None = None,
        event_id: str | None = None, create: bool = True,
    ) -> tuple[int, int]:  # fmt: skip
        """`append`, answering (the sequence of the first event written, the one `data`
        got); `create` defaults to opening a session that has no log yet."""
        done = await self.append(tenant, session, data, turn=turn, event_id=event_id, create=create)
        return done.first_seq, done.seq

    @property
    def actor(self) -> Actor:
        return Actor(service="gateway", replica=self.replica)


def open_log(
    nc: Client, store: EventStore, blobs: JetStreamBlobs, codec: Codec, replica: str
) -> SessionLog:
    return SessionLog(
        nc=nc, store=store, blobs=blobs, codec=codec, replica=replica,
        hub=Hub(nc, blobs, codec, store),
    )  # fmt: skip


async def session_log(connection: HTTPConnection) -> SessionLog:
    """This replica's writer and handles, opened with the rest once the mesh is there."""
    state = connection.app.state.gateway
    nc: Client | None = state.nc
    if nc is None or not nc.is_connected:
        raise ApiError(
            503, "nats_unavailable", "the gateway has no bus connection; retry shortly",
            headers={"Retry-After": "1"},
        )  # fmt: skip
    log: SessionLog | None = state.log
    if log is None:
        raise ApiError(
            503, "not_ready",
            "the gateway is waiting for the mesh's streams and buckets; see GET /ready",
            headers={"Retry-After": "1"},
        )  # fmt: skip
    return log
