"""One socket's view of one session: its stored events from a sequence on, then each new one as
it is stored, and the live deltas, through one bounded queue.

The earlier system dropped the oldest frame when a subscriber's queue of 256 filled, so a slow
client lost events without knowing. Here a full queue ends the watch (`Overflowed`, carrying
the last sequence the socket actually sent) and the socket closes with a code that tells the
client to reconnect from there: it misses nothing and sees nothing twice, because every frame
carries its stream sequence and a watch starts strictly after the one it is given.

Frames are built from the stored bytes, not a re-encoding: the event a client sees is byte for
byte the one the chain covers (an offloaded event is sent as the payload its stub pins, checked
against its digest), and a frame is only decoded when one of its strings is over the cap.
"""

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import ConsumerConfig, DeliverPolicy

from fleet_events import streams, subjects
from fleet_events.chain import HASH_HEADER, TYPE_HEADER
from fleet_events.codec import Codec, CodecError, sha256_hex
from fleet_events.envelope import Offloaded
from fleet_events.session import log_subject, session_filter
from fleet_mesh.blobs import JetStreamBlobs

TraceMode = Literal["compact", "verbose", "off"]
TRACE_MODES: tuple[TraceMode, ...] = ("compact", "verbose", "off")

STRING_CAP: dict[TraceMode, int] = {"compact": 2_000, "verbose": 65_536, "off": 2_000}
"""Characters one string of a frame may carry (the earlier system capped at 65,536). A frame
cut to fit says `"truncated": true`; the export has every byte."""


class Overflowed(Exception):
    """The socket fell `limit` frames behind: it closes, and the client resumes from
    `last_seq` (the last event frame the socket sent)."""

    def __init__(self, last_seq: int, limit: int) -> None:
        super().__init__(f"more than {limit} frames waiting; last sequence sent {last_seq}")
        self.last_seq = last_seq
        self.limit = limit


def _cut(value: Any, cap: int) -> tuple[Any, bool]:
    if isinstance(value, str):
        return (value[:cap], True) if len(value) > cap else (value, False)
    if isinstance(value, list):
        cut = [_cut(item, cap) for item in value]
        return [v for v, _ in cut], any(c for _, c in cut)
    if isinstance(value, dict):
        items = {key: _cut(item, cap) for key, item in value.items()}
        return {k: v for k, (v, _) in items.items()}, any(c for _, c in items.values())
    return value, False


def event_frame(subject: str, seq: int, event_hash: str, payload: bytes, cap: int) -> str:
    """`{"type":"event","seq":…,"subject":…,"hash":…,"event":<stored envelope>}`."""
    truncated = b""
    if len(payload) > cap:  # no string can be longer than the bytes that hold it
        value, cut = _cut(msgspec.json.decode(payload), cap)
        if cut:
            payload, truncated = msgspec.json.encode(value), b',"truncated":true'
    head = f'{{"type":"event","seq":{seq},"subject":"{subject}","hash":"{event_hash}","event":'
    return (head.encode() + payload + truncated + b"}").decode()


def delta_frame(data: bytes, cap: int) -> str | None:
    """A live delta as its frame, or None for bytes that are not a delta (never forwarded)."""
    try:
        delta = msgspec.json.decode(data, type=_Delta)
    except msgspec.DecodeError:
        return None
    return msgspec.json.encode(
        {"type": "delta", "kind": delta.kind, "run": delta.run, "text": delta.text[:cap]}
    ).decode()


class _Delta(msgspec.Struct, frozen=True):
    kind: str
    run: str | None = None
    text: str = ""


@dataclass
class Watch:
    """Start with `start()`, read frames with `next()`, end with `stop()`."""

    nc: Client
    blobs: JetStreamBlobs
    codec: Codec
    tenant: str
    session: str
    after_seq: int
    trace_mode: TraceMode = "compact"
    limit: int = 1024

    def __post_init__(self) -> None:
        self._queue: asyncio.Queue[tuple[int, str]] = asyncio.Queue(maxsize=self.limit)
        self._queued_seq = self.after_seq
        self.sent_seq = self.after_seq
        self._overflow = asyncio.Event()
        self._failure: BaseException | None = None
        self._subs: list[Subscription] = []

    async def start(self) -> None:
        cap = STRING_CAP[self.trace_mode]
        if self.trace_mode == "off":  # the session-level log only: no run steps, no deltas
            feed = log_subject(self.tenant, self.session)
        else:
            feed = session_filter(self.tenant, self.session)

            async def on_delta(msg: Msg) -> None:
                frame = delta_frame(msg.data, cap)
                if frame is not None:
                    self._put(0, frame)

            self._subs.append(
                await self.nc.subscribe(subjects.live(self.tenant, self.session), cb=on_delta)
            )

        async def on_event(msg: Msg) -> None:
            seq = msg.metadata.sequence.stream
            if seq <= self._queued_seq or self._overflow.is_set():
                return  # a redelivery after the consumer was recreated: already queued
            headers = msg.headers or {}
            try:
                payload = await self._payload(msg.subject, headers, msg.data)
            except (CodecError, LookupError, ValueError) as exc:
                self._failure = exc
                self._overflow.set()
                return
            self._queued_seq = seq
            self._put(
                seq, event_frame(msg.subject, seq, headers.get(HASH_HEADER, ""), payload, cap)
            )

        start = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self.after_seq + 1
        )
        self._subs.append(
            await self.nc.jetstream().subscribe(
                feed,
                stream=streams.SESSIONS.name,
                ordered_consumer=True,
                config=start,
                idle_heartbeat=5.0,
                cb=on_event,
            )
        )

    async def _payload(self, subject: str, headers: dict[str, str], data: bytes) -> bytes:
        if headers.get(TYPE_HEADER) != "blob.offloaded":
            return data
        stub = self.codec.decode_stored(data)
        if not isinstance(stub.data, Offloaded):
            return data
        ref = stub.data.blob
        # read for the subject's tenant, never for the tenant the stored bytes claim
        full = await self.blobs.get(self.tenant, ref.sha256)
        if sha256_hex(full) != ref.sha256 or len(full) != ref.size:
            raise CodecError(f"offloaded payload of event {stub.id} does not match its digest")
        return full

    def _put(self, seq: int, frame: str) -> None:
        if self._overflow.is_set():
            return
        try:
            self._queue.put_nowait((seq, frame))
        except asyncio.QueueFull:
            self._overflow.set()

    def delivered(self, frame_seq: int) -> None:
        if frame_seq:
            self.sent_seq = frame_seq

    async def next(self) -> tuple[int, str]:
        """The next frame and its sequence (0 for a delta); raises `Overflowed` once the queue
        overflowed (frames still queued are not sent: the client gets them again from
        `sent_seq`)."""
        if self._overflow.is_set():
            raise self._ended()
        getter = asyncio.ensure_future(self._queue.get())
        stopper = asyncio.ensure_future(self._overflow.wait())
        try:
            await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            if not getter.done():
                getter.cancel()
        if not getter.done() or getter.cancelled():
            raise self._ended()
        return getter.result()

    def _ended(self) -> BaseException:
        if self._failure is not None:
            return self._failure
        return Overflowed(self.sent_seq, self.limit)

    async def stop(self) -> None:
        for sub in self._subs:
            with contextlib.suppress(Exception):  # a connection already closing
                await sub.unsubscribe()
        self._subs.clear()
