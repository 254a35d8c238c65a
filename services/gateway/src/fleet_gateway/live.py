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
import collections
import contextlib
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
from fleet_mesh.elections import through_election

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


def feed_of(tenant: str, session: str, mode: TraceMode) -> str:
    """`off`: the session-level log only (no run steps, no deltas); else the whole session."""
    return log_subject(tenant, session) if mode == "off" else session_filter(tenant, session)


class Channel:
    """One session's feed on this replica, shared by every socket watching it in one trace
    mode: one ordered consumer and one frame per event however many sockets watch, so a
    hundred clients cost the bus one delivery, not a hundred.

    It starts at the stream's end when its first socket joins; a socket that needs older
    events reads them itself (`Watch.start`) up to `last_seq`, the last event this channel
    handed out, and takes the rest from here.
    """

    def __init__(self, hub: "Hub", key: tuple[str, str, TraceMode]) -> None:
        self.hub, self.key = hub, key
        self.tenant, self.session, self.mode = key
        self.feed = feed_of(*key)
        self.cap = STRING_CAP[self.mode]
        self.last_seq = 0
        self.members: set[Watch] = set()
        self._subs: list[Subscription] = []

    async def open(self) -> None:
        try:
            await self._open()
        except BaseException:
            await self.close()  # nothing half-open stays subscribed
            raise

    async def _open(self) -> None:
        js = self.hub.nc.jetstream()
        # a SESSIONS leader lost in a cluster answers nothing until the next is elected
        info = await through_election(lambda: js.stream_info(streams.SESSIONS.name))
        self.last_seq = info.state.last_seq
        if self.mode != "off":
            self._subs.append(
                await self.hub.nc.subscribe(
                    subjects.live(self.tenant, self.session), cb=self._on_delta
                )
            )
        start = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self.last_seq + 1
        )
        self._subs.append(
            await js.subscribe(
                self.feed, stream=streams.SESSIONS.name, ordered_consumer=True, config=start,
                idle_heartbeat=5.0, cb=self._on_event,
            )
        )  # fmt: skip

    async def _on_delta(self, msg: Msg) -> None:
        frame = delta_frame(msg.data, self.cap)
        if frame is not None:
            for member in list(self.members):
                member.offer(0, frame)

    async def _on_event(self, msg: Msg) -> None:
        seq = msg.metadata.sequence.stream
        if seq <= self.last_seq:
            return  # a redelivery after the consumer was recreated
        headers = msg.headers or {}
        try:
            frame = await self.hub.frame(msg.subject, seq, headers, msg.data, self.tenant, self.cap)
        except (CodecError, LookupError, ValueError) as exc:
            for member in list(self.members):
                member.fail(exc)
            return
        self.last_seq = seq
        for member in list(self.members):
            member.offer(seq, frame)

    async def close(self) -> None:
        for sub in self._subs:
            with contextlib.suppress(Exception):  # a connection already closing
                await sub.unsubscribe()
        self._subs.clear()


class Hub:
    """This replica's channels, opened on a socket's first join and closed with its last."""

    def __init__(self, nc: Client, blobs: JetStreamBlobs, codec: Codec, reader: Any) -> None:
        self.nc, self.blobs, self.codec, self.reader = nc, blobs, codec, reader
        self.channels: dict[tuple[str, str, TraceMode], Channel] = {}
        self._lock = asyncio.Lock()

    async def join(self, watch: "Watch") -> Channel:
        key = (watch.tenant, watch.session, watch.trace_mode)
        async with self._lock:
            channel = self.channels.get(key)
            if channel is None:
                channel = Channel(self, key)
                await channel.open()
                self.channels[key] = channel
            channel.members.add(watch)
        return channel

    async def leave(self, watch: "Watch", channel: Channel) -> None:
        async with self._lock:
            channel.members.discard(watch)
            if not channel.members and self.channels.get(channel.key) is channel:
                del self.channels[channel.key]
                await channel.close()

    async def frame(
        self, subject: str, seq: int, headers: dict[str, str], data: bytes, tenant: str, cap: int
    ) -> str:
        payload = await self._payload(headers, data, tenant)
        return event_frame(subject, seq, headers.get(HASH_HEADER, ""), payload, cap)

    async def _payload(self, headers: dict[str, str], data: bytes, tenant: str) -> bytes:
        if headers.get(TYPE_HEADER) != "blob.offloaded":
            return data
        stub = self.codec.decode_stored(data)
        if not isinstance(stub.data, Offloaded):
            return data
        ref = stub.data.blob
        # read for the subject's tenant, never for the tenant the stored bytes claim
        full = await self.blobs.get(tenant, ref.sha256)
        if sha256_hex(full) != ref.sha256 or len(full) != ref.size:
            raise CodecError(f"offloaded payload of event {stub.id} does not match its digest")
        return full


class Watch:
    """One socket's view: `start()` (its backlog, then the shared channel), `next()`,
    `delivered(seq)` after each send, `stop()`.

    The backlog is read with backpressure (a slow socket only slows its own reads); the live
    events arriving meanwhile wait in the same bounded queue's budget, and only live frames
    can overflow it.
    """

    def __init__(
        self, hub: Hub, tenant: str, session: str, after_seq: int,
        trace_mode: TraceMode = "compact", limit: int = 1024,
    ) -> None:  # fmt: skip
        self.hub, self.tenant, self.session = hub, tenant, session
        self.after_seq, self.trace_mode, self.limit = after_seq, trace_mode, limit
        self._frames: collections.deque[tuple[int, str]] = collections.deque()
        self._ready = asyncio.Event()  # a frame was queued, or the watch ended
        self._space = asyncio.Event()  # a frame was taken (the backlog waits for room)
        self._pending: list[tuple[int, str]] | None = []  # live frames held during the backlog
        self._queued_seq = after_seq
        self.sent_seq = after_seq
        self._overflow = asyncio.Event()
        self._failure: BaseException | None = None
        self._channel: Channel | None = None
        self._backlog: asyncio.Task[None] | None = None

    async def start(self) -> None:
        channel = await self.hub.join(self)
        self._channel = channel
        upto = channel.last_seq  # what the channel handed out before this socket joined
        self._backlog = asyncio.create_task(self._read_backlog(channel, upto))

    async def _read_backlog(self, channel: Channel, upto: int) -> None:
        try:
            if upto > self.after_seq:
                async for raw in self.hub.reader.read_raw(
                    channel.feed, from_seq=self.after_seq + 1, up_to_seq=upto
                ):
                    frame = await self.hub.frame(
                        raw.subject, raw.seq, raw.headers, raw.data, self.tenant, channel.cap
                    )
                    while len(self._frames) >= self.limit and not self._overflow.is_set():
                        self._space.clear()  # backpressure: a slow socket slows its own reads
                        await self._space.wait()
                    self._frames.append((raw.seq, frame))
                    self._ready.set()
                    self._queued_seq = raw.seq
            pending, self._pending = self._pending or [], None
            for seq, frame in pending:
                self.offer(seq, frame)
        except (CodecError, LookupError, ValueError, TimeoutError) as exc:
            self.fail(exc)

    def offer(self, seq: int, frame: str) -> None:
        if self._overflow.is_set():
            return
        if self._pending is not None:
            self._pending.append((seq, frame))
            if len(self._pending) > self.limit:
                self._end()
            return
        if seq and seq <= self._queued_seq:
            return
        if len(self._frames) >= self.limit:
            self._end()
            return
        self._frames.append((seq, frame))
        self._ready.set()
        if seq:
            self._queued_seq = seq

    def fail(self, exc: BaseException) -> None:
        self._failure = exc
        self._end()

    def _end(self) -> None:
        self._overflow.set()
        self._ready.set()  # the socket's pump wakes and ends
        self._space.set()  # the backlog reader too

    async def next(self) -> tuple[int, str]:
        """The next frame and its sequence (0 for a delta); raises `Overflowed` once the queue
        overflowed (frames still queued are not sent: the client gets them again from
        `sent_seq`). One event to wait on, no tasks made per frame: a socket that gets a frame
        now and then (100 sockets at 50 events/s) wakes once per frame, for one future."""
        while True:
            if self._overflow.is_set():
                raise self._ended()
            if self._frames:
                item = self._frames.popleft()
                self._space.set()
                return item
            self._ready.clear()
            await self._ready.wait()

    def delivered(self, frame_seq: int) -> None:
        if frame_seq:
            self.sent_seq = frame_seq

    def _ended(self) -> BaseException:
        if self._failure is not None:
            return self._failure
        return Overflowed(self.sent_seq, self.limit)

    async def stop(self) -> None:
        if self._backlog is not None:
            self._backlog.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._backlog
        if self._channel is not None:
            await self.hub.leave(self, self._channel)
            self._channel = None
