"""Waiting for events: `watch(subject, types, after_seq)` hands out each event of the given
types stored on a subject (or wildcard) after a sequence, as it is stored, with no gap.

What it replaces: a core subscription, a flush so the server holds it, then a read of the
stream's tail, so an event stored between the read and the subscription is seen by one or the
other. That waiter was written five times, each with its own answer to the questions it raises
(an event announced on core NATS whose append the stream refused, a message lost across a
reconnect, the same event seen by the read and the subscription). Here one ordered consumer
answers them: it delivers only what the stream stored, in stream order, each event once; it
starts strictly after `after_seq`, or, with `after_seq=None`, after the last event stored when
`watch` is called (read first, so a read made after `watch` returns overlaps nothing and misses
nothing); and the client library recreates it from the last sequence seen when a delivery goes
missing (after a reconnect, say).

Only the types asked for are decoded (picked by the `Fleet-Type` header), so a watch for a
turn's cancel on a busy session log decodes nothing else.
"""

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Collection
from types import TracebackType
from typing import Any, Generic, TypeVar

from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy

from fleet_events import subjects
from fleet_events.chain import TYPE_HEADER
from fleet_events.envelope import Event
from fleet_mesh.store.model import RawEvent, StoredEvent
from fleet_mesh.store.reads import Reader, headers_of

T = TypeVar("T")
Types = Collection[str | type[Event]] | None
"""Wire tags or event classes to hand out; None: every event."""

HEARTBEAT_S = 5.0


def _tags(types: Types) -> frozenset[str] | None:
    if types is None:
        return None
    tags = set()
    for kind in types:
        tags.add(kind if isinstance(kind, str) else str(kind.__struct_config__.tag))
    if not tags:
        raise ValueError("watch for no event type at all: pass None to watch every type")
    return frozenset(tags)


class Watch(Generic[T]):
    """An open watch. Iterate it (`async for`), take one event with `next(timeout)`, or give
    `watch` a callback; `close()` (or leaving `async with`) ends it."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[T | BaseException] = asyncio.Queue()
        self._sub: Any = None
        self.last_seq = 0
        """The stream sequence of the last event the watch saw (of any type)."""

    def _offer(self, item: T | BaseException) -> None:
        self._queue.put_nowait(item)

    async def next(self, timeout: float | None = None) -> T | None:
        """The next event, or None when `timeout` seconds pass without one."""
        try:
            item = await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            return None
        if isinstance(item, BaseException):
            raise item
        return item

    def __aiter__(self) -> "Watch[T]":
        return self

    async def __anext__(self) -> T:
        item = await self.next()
        assert item is not None  # no timeout: only an event ends the wait
        return item

    async def close(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(Exception):  # a connection already closing
                await sub.unsubscribe()

    # the subscription-like name the waiters it replaced used
    unsubscribe = close

    async def __aenter__(self) -> "Watch[T]":
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self.close()


class Watches(Reader):
    async def watch(
        self,
        subject: str,
        types: Types = None,
        *,
        after_seq: int | None = None,
        cb: Callable[[StoredEvent], Awaitable[None]] | None = None,
    ) -> Watch[StoredEvent]:
        """Each event of `types` stored on `subject` after `after_seq` (None: after what is
        stored now), decoded. With `cb`, each goes to it (on the connection's loop, in order)
        instead of the watch's queue. An event that cannot be decoded is raised from `next`
        (or, with `cb`, skipped: a callback has no caller to raise to)."""
        watch: Watch[StoredEvent] = Watch()
        tags = _tags(types)

        async def deliver(msg: Msg) -> None:
            seq = msg.metadata.sequence.stream
            if seq <= watch.last_seq:
                return  # a redelivery after the consumer was recreated
            watch.last_seq = seq
            headers = headers_of(msg)
            if tags is not None and headers.get(TYPE_HEADER) not in tags:
                return
            try:
                stored = await self._stored(msg.subject, seq, headers, msg.data)
            except Exception as exc:
                if cb is None:
                    watch._offer(exc)
                return
            if cb is None:
                watch._offer(stored)
            else:
                await cb(stored)

        watch._sub = await self._watch_sub(watch, subject, after_seq, deliver)
        return watch

    async def watch_raw(
        self,
        subject: str,
        types: Types = None,
        *,
        after_seq: int | None = None,
        cb: Callable[[RawEvent], Awaitable[None]] | None = None,
    ) -> Watch[RawEvent]:
        """As `watch`, handing out the stored bytes undecoded (frames built from the bytes
        the chain covers, a doorbell that needs no payload)."""
        watch: Watch[RawEvent] = Watch()
        tags = _tags(types)

        async def deliver(msg: Msg) -> None:
            seq = msg.metadata.sequence.stream
            if seq <= watch.last_seq:
                return
            watch.last_seq = seq
            headers = headers_of(msg)
            if tags is not None and headers.get(TYPE_HEADER) not in tags:
                return
            raw = RawEvent(msg.subject, seq, headers, msg.data)
            if cb is None:
                watch._offer(raw)
            else:
                await cb(raw)

        watch._sub = await self._watch_sub(watch, subject, after_seq, deliver)
        return watch

    async def _watch_sub(
        self,
        watch: "Watch[Any]",
        subject: str,
        after_seq: int | None,
        deliver: Callable[[Msg], Awaitable[None]],
    ) -> Any:
        if after_seq is None:
            after_seq = await self._stored_upto(subject)
        elif after_seq < 0:
            raise ValueError(f"after_seq must be 0 or more, got {after_seq}")
        # nats-py recreates an ordered consumer that has delivered nothing yet from sequence 1:
        # what it then replays up to `after_seq` is dropped by the watch's own mark
        watch.last_seq = after_seq
        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=after_seq + 1
        )
        return await self._js.subscribe(
            subject,
            stream=self._stream,
            ordered_consumer=True,
            config=config,
            idle_heartbeat=HEARTBEAT_S,
            cb=deliver,
        )

    async def _stored_upto(self, subject: str) -> int:
        """A sequence at or after the last event stored on `subject` now: the subject's own
        last (one direct get) or, for a wildcard, the stream's."""
        if subjects.is_wildcard(subject):
            info = await self._js.stream_info(self._stream)
            return int(info.state.last_seq)
        last = await self._last_raw(subject)
        return (last.seq or 0) if last is not None else 0
