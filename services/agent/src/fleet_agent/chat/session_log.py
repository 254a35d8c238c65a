"""The chat agent's writes to the session's `.log` (memory, documents, input requests) and its
wait for an answer. Coroutines for the engine bus's loop, where the store's connection lives.

Others append to the same log while a turn runs (the gateway's next message, a cancel, the
dispatcher's refusals): the chat agent's facts commute with theirs, so each is appended through
the decider kernel, which starts at the log's head and decides again (the same fact) when the
log moved.
"""

import asyncio
import contextlib
import weakref
from dataclasses import dataclass

from nats.aio.msg import Msg

from fleet_agent.domain import facts
from fleet_agent.engine.model import CancelFlag, EngineMesh
from fleet_agent.lenient import LenientCodec
from fleet_events import Envelope, Event, new_id, utc_now
from fleet_events.catalog import type_of_class
from fleet_events.chain import TYPE_HEADER
from fleet_events.session import InputExpired, InputProvided, log_subject
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.decider import Decider, Ledger, Request
from fleet_mesh.store import Appended, EventStore

ANSWERS = frozenset({type_of_class(InputProvided), type_of_class(InputExpired)})

FACTS = Ledger(
    name="agent-session-facts", initial=lambda: None, evolve=lambda state, _: state,
    clone=lambda state: state, types=frozenset(), replay=False,
)  # fmt: skip
"""The chat agent's facts read nothing of the log: a new log starts at its head, unread."""

_writers: "weakref.WeakKeyDictionary[EventStore, Decider[None]]" = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class LogScope:
    tenant: str
    session: str
    turn: str
    run: str


async def append(
    mesh: EngineMesh,
    scope: LogScope,
    event: Event,
    *,
    event_id: str | None = None,
    causation: str | None = None,
) -> Appended:
    """Store `event` after whatever the log holds (the decider kernel retries a lost race),
    under `event_id` (its `Nats-Msg-Id`: a second append of one id within the duplicate
    window is dropped) and `causation` (the tool call that made it) when given."""
    envelope_id = event_id or new_id()
    writer = _writers.get(mesh.store)
    if writer is None:
        writer = _writers[mesh.store] = Decider(mesh.store, FACTS, capacity=256)

    def wrap(_: None, data: Event) -> Envelope[Event]:
        return Envelope(
            id=envelope_id, tenant=scope.tenant, session=scope.session, turn=scope.turn,
            run=scope.run, actor=mesh.actor, ts=utc_now(), data=data, correlation=scope.turn,
            causation=causation,
        )  # fmt: skip

    subject = log_subject(scope.tenant, scope.session)
    _, (appended,) = await writer.place(subject, Request(None, lambda s: facts(s, event), wrap))
    return appended


async def wait_for_answer(
    mesh: EngineMesh,
    scope: LogScope,
    request_id: str,
    *,
    after_seq: int,
    timeout_s: float,
    cancel: CancelFlag,
) -> InputProvided | InputExpired | None:
    """The answer (or expiry) to `request_id` stored after `after_seq`; None on timeout or
    cancel. Listens first, then reads what was stored meanwhile, so no answer falls between."""
    codec = LenientCodec(await JetStreamBlobs.open(mesh.bus.nc.jetstream()))
    loop = asyncio.get_running_loop()
    found: asyncio.Future[InputProvided | InputExpired | None] = loop.create_future()

    def settle(value: InputProvided | InputExpired | None) -> None:
        if not found.done():
            found.set_result(value)

    async def consider(data: bytes) -> None:
        with contextlib.suppress(Exception):  # a message that does not decode is not ours
            envelope = await codec.decode(data, tenant=scope.tenant)
            answer = envelope.data
            if isinstance(answer, InputProvided | InputExpired) and answer.request_id == request_id:
                settle(answer)

    async def on_message(msg: Msg) -> None:
        if (msg.headers or {}).get(TYPE_HEADER) in ANSWERS:
            await consider(msg.data)

    subject = log_subject(scope.tenant, scope.session)
    sub = await mesh.bus.nc.subscribe(subject, cb=on_message)
    release = cancel.on_set(lambda: loop.call_soon_threadsafe(settle, None))
    try:
        async for raw in mesh.store.read_raw(subject, from_seq=after_seq + 1):
            if raw.headers.get(TYPE_HEADER) in ANSWERS:
                await consider(raw.data)
        try:
            return await asyncio.wait_for(asyncio.shield(found), timeout_s)
        except TimeoutError:
            return None
    finally:
        release()
        await sub.unsubscribe()
