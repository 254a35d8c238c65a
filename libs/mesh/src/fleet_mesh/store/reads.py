"""Reading the log: heads, last events, tails, replays (batched direct gets), live subscription.

`Reader` also holds what every part of the store shares (the connection, the stream, the codec
and the deadline): appends, snapshots and audits are built on reads.
"""

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy, RawStreamMsg
from nats.js.errors import NotFoundError
from nats.js.kv import KeyValue

from fleet_events.binding import subject_tenant
from fleet_events.chain import HASH_HEADER, PREV_HEADER
from fleet_events.codec import Codec
from fleet_events.signing import Signer
from fleet_events.streams import StreamSpec
from fleet_mesh.store.errors import StoreUnavailable
from fleet_mesh.store.headers import direct_more, direct_raw, head_of
from fleet_mesh.store.model import EMPTY, Head, RawEvent, StoredEvent

READ_BATCH = 1000
NO_LIMIT = 2**63 - 1


def headers_of(msg: Msg | RawStreamMsg) -> dict[str, str]:
    return dict(msg.headers or {})


class Reader:
    def __init__(
        self,
        js: JetStreamContext,
        stream: StreamSpec,
        codec: Codec,
        *,
        nc: Client | None = None,
        snapshots: KeyValue | None = None,
        timeout: float = 5.0,
        signer: Signer | None = None,
    ) -> None:
        self._js = js
        self._signer = signer  # appends are signed with it (None: unsigned)
        self._nc: Client = nc if nc is not None else js._nc
        self._stream = stream.name
        self._codec = codec
        self._snapshots = snapshots
        self._timeout = timeout
        self._encoder = msgspec.msgpack.Encoder()
        self._direct_get = f"$JS.API.DIRECT.GET.{stream.name}"

    async def _last_raw(self, subject: str) -> RawStreamMsg | None:
        try:
            return await self._js.get_last_msg(self._stream, subject, direct=True)
        except NotFoundError:
            return None

    async def head(self, subject: str) -> Head:
        raw = await self._last_raw(subject)
        if raw is None:
            return EMPTY
        return head_of(subject, raw.seq or 0, headers_of(raw))

    async def last(self, subject: str) -> StoredEvent | None:
        raw = await self._last_raw(subject)
        if raw is None:
            return None
        return await self._stored(
            raw.subject or subject, raw.seq or 0, headers_of(raw), raw.data or b""
        )

    async def _stored(
        self, subject: str, seq: int, headers: dict[str, str], data: bytes
    ) -> StoredEvent:
        return StoredEvent(
            subject=subject,
            seq=seq,
            envelope=await self._codec.decode(data, tenant=subject_tenant(subject)),
            hash=headers.get(HASH_HEADER, ""),
            prev_hash=headers.get(PREV_HEADER, ""),
        )

    async def decoded(self, raw: RawEvent) -> StoredEvent:
        """A raw stored message decoded (for readers that pick what to decode by its type)."""
        return await self._stored(raw.subject, raw.seq, raw.headers, raw.data)

    async def tail(self, subject: str, *, after_seq: int) -> AsyncIterator[StoredEvent]:
        """Everything after `after_seq`, with no head lookup first: a short tail (a writer
        catching up after a lost race) costs exactly one round trip."""
        async for raw in self.read_raw(subject, from_seq=after_seq + 1, up_to_seq=NO_LIMIT):
            yield await self._stored(raw.subject, raw.seq, raw.headers, raw.data)

    async def read_raw(
        self, filter_subject: str, *, from_seq: int = 1, up_to_seq: int | None = None
    ) -> AsyncIterator[RawEvent]:
        """Stored messages in stream order, up to the head at call time (or `up_to_seq`).

        Batched direct gets (server >= 2.11): the server streams up to `READ_BATCH` matching
        messages per request, with no consumer to create or delete, so a short tail costs one
        round trip and a long replay a few. Streams are created with `allow_direct`.
        """
        if up_to_seq is None:
            last = await self._last_raw(filter_subject)
            up_to_seq = (last.seq or 0) if last is not None else 0
        seq = from_seq
        while seq <= up_to_seq:
            batch, more = await self._direct_batch(filter_subject, seq)
            for raw in batch:
                if raw.seq > up_to_seq:
                    return
                yield raw
            if not more or not batch:
                return
            seq = batch[-1].seq + 1

    async def _direct_batch(
        self, filter_subject: str, seq: int, *, limit: int = READ_BATCH
    ) -> tuple[list[RawEvent], bool]:
        """One batched direct get: the messages, and whether more match after them."""
        messages: list[Msg] = []
        finished: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()

        async def collect(msg: Msg) -> None:  # a callback: far cheaper than next_msg per message
            if msg.headers and "Status" in msg.headers:
                if not finished.done():
                    finished.set_result(msg)
            else:
                messages.append(msg)

        request = {"seq": seq, "next_by_subj": filter_subject, "batch": limit}
        sub = await self._nc.subscribe(
            self._nc.new_inbox(), cb=collect, pending_msgs_limit=READ_BATCH * 2
        )
        where = f"{filter_subject} from {seq}"
        try:
            payload = json.dumps(request, separators=(",", ":")).encode()
            await self._nc.publish(self._direct_get, payload, sub.subject)
            end = await asyncio.wait_for(finished, self._timeout)
        except TimeoutError as exc:
            raise StoreUnavailable(f"reading {where}: no answer in time") from exc
        finally:
            await sub.unsubscribe()
        more = direct_more(where, headers_of(end))
        return [direct_raw(headers_of(msg), msg.data) for msg in messages], more

    async def replay(self, filter_subject: str, *, from_seq: int = 1) -> AsyncIterator[StoredEvent]:
        """Events of a subject or wildcard, in stream order, up to the head at call time."""
        async for raw in self.read_raw(filter_subject, from_seq=from_seq):
            yield await self._stored(raw.subject, raw.seq, raw.headers, raw.data)

    async def subscribe(
        self, filter_subject: str, *, from_seq: int = 1
    ) -> AsyncGenerator[StoredEvent, None]:
        """Live: everything from `from_seq`, then each new event as it lands. Never ends: the
        caller stops it with `aclose()`, which removes the consumer.

        An ordered consumer: the server pushes new events as they are stored, and the client
        library recreates the consumer from the last sequence seen if a message goes missing.
        """
        start = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=max(1, from_seq)
        )
        sub = await self._js.subscribe(
            filter_subject,
            stream=self._stream,
            ordered_consumer=True,
            config=start,
            idle_heartbeat=5.0,
        )
        try:
            while True:
                msg = await sub.next_msg(timeout=None)
                yield await self._stored(
                    msg.subject, msg.metadata.sequence.stream, headers_of(msg), msg.data
                )
        finally:
            await sub.unsubscribe()
