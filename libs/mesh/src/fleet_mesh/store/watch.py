"""Waiting for events: `watch(subject, types, after_seq)` hands out each event of the given
types stored on a subject (or wildcard) after a sequence, as it is stored, each once, in
stream order, with no gap.

What it replaces: a core subscription, a flush so the server holds it, then a read of the
stream's tail, so an event stored between the read and the subscription is seen by one or the
other. That waiter was written five times, each with its own answer to the questions it raises.
Here they are answered once:

- What is handed out is read from the stream (batched direct gets from the last sequence
  handed out), never taken from the core message: a publish the stream refused (a stale
  `expect`, a fenced holder) reaches core subscribers all the same, and is never handed out.
- Core NATS is the doorbell only: a message of a watched type makes the watch read the tail.
  The subscription is held by the server (flushed) before the first read, so an event stored
  after that read rings it. Core NATS can deliver a message before the stream has stored it:
  a ring whose event (by its id) a read has not found reads again, a few times over
  `CONFIRM_S`.
- A message lost across a reconnect rings nothing: every `recheck_s` the tail is read anyway.
- `after_seq=None` means after what is stored when `watch` returns (the subject's last event,
  or for a wildcard the stream's, read once the subscription is held): a read made after
  `watch` returns overlaps nothing the watch hands out, and misses nothing.

Why not an ordered consumer: creating one costs the server a consumer and the caller two to
four times a flushed subscription (measured here: 1.8-3.0 ms against 0.8 ms), a cost the turn
worker would pay on every turn, and consumers left behind by churn count against the stream's
limit. Only the types asked for are decoded (picked by the `Fleet-Type` header).
"""

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable, Collection
from types import TracebackType
from typing import Generic, TypeVar

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from fleet_events import subjects
from fleet_events.chain import TYPE_HEADER
from fleet_events.envelope import Event
from fleet_mesh.store.headers import MSG_ID
from fleet_mesh.store.model import RawEvent, StoredEvent
from fleet_mesh.store.reads import NO_LIMIT, Reader

T = TypeVar("T")
Types = Collection[str | type[Event]] | None
"""Wire tags or event classes to hand out; None: every event."""

RECHECK_S = 5.0
CONFIRM_S = 2.0
"""How long a ring's event may take to show in the stream before the ring is taken for a
publish the stream refused."""

log = logging.getLogger("fleet.store")


def _tags(types: Types) -> frozenset[str] | None:
    if types is None:
        return None
    tags = {kind if isinstance(kind, str) else str(kind.__struct_config__.tag) for kind in types}
    if not tags:
        raise ValueError("watch for no event type at all: pass None to watch every type")
    return frozenset(tags)


class Watch(Generic[T]):
    """An open watch. Iterate it (`async for`), take one event with `next(timeout)`, or give
    `watch` a callback; `close()` (or leaving `async with`) ends it."""

    def __init__(self, after_seq: int, tags: frozenset[str] | None) -> None:
        self.last_seq = after_seq
        """The stream sequence the watch has read up to (events of any type)."""
        self.tags = tags
        self._queue: asyncio.Queue[T | BaseException] = asyncio.Queue()
        self._bell = asyncio.Event()
        self._rung: set[str] = set()
        """Event ids core NATS announced that no read has found yet."""
        self._sub: Subscription | None = None
        self._pump: asyncio.Task[None] | None = None

    def wanted(self, headers: dict[str, str]) -> bool:
        return self.tags is None or headers.get(TYPE_HEADER) in self.tags

    async def _ring(self, msg: Msg) -> None:
        headers = dict(msg.headers or {})
        if self.wanted(headers):
            self._rung.add(headers.get(MSG_ID, ""))
            self._bell.set()

    async def next(self, timeout: float | None = None) -> T | None:
        """The next event, or None when `timeout` seconds pass without one."""
        try:
            async with asyncio.timeout(timeout):  # not wait_for: on 3.11 it can eat a cancel
                item = await self._queue.get()
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
        pump, self._pump = self._pump, None
        while pump is not None and not pump.done():
            pump.cancel()  # again if a cancel was lost in a race with a wake-up
            await asyncio.wait({pump}, timeout=1.0)
        if pump is not None and not pump.cancelled() and pump.exception() is not None:
            log.warning("watch ended by an error", extra={"error": repr(pump.exception())})
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(Exception):  # a connection already closing
                await sub.unsubscribe()

    unsubscribe = close
    """The name of what the waiters it replaced returned (a subscription)."""

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
        recheck_s: float = RECHECK_S,
    ) -> Watch[StoredEvent]:
        """Each event of `types` stored on `subject` after `after_seq` (None: after what is
        stored now), decoded. With `cb`, each goes to it, in order, instead of the watch's
        queue. An event that cannot be decoded is raised from `next` (with `cb`, logged and
        skipped: a callback has no caller to raise to)."""

        async def hand(watch: Watch[StoredEvent], raw: RawEvent) -> None:
            try:
                stored = await self._stored(raw.subject, raw.seq, raw.headers, raw.data)
            except Exception as exc:
                if cb is None:
                    watch._queue.put_nowait(exc)
                else:
                    log.warning("watched event skipped", extra={"seq": raw.seq, "error": repr(exc)})
                return
            await (cb(stored) if cb is not None else _put(watch, stored))

        return await self._open(subject, types, after_seq, recheck_s, hand)

    async def watch_raw(
        self,
        subject: str,
        types: Types = None,
        *,
        after_seq: int | None = None,
        cb: Callable[[RawEvent], Awaitable[None]] | None = None,
        recheck_s: float = RECHECK_S,
    ) -> Watch[RawEvent]:
        """As `watch`, handing out the stored bytes undecoded (frames built from the bytes the
        chain covers, a doorbell that needs no payload)."""

        async def hand(watch: Watch[RawEvent], raw: RawEvent) -> None:
            await (cb(raw) if cb is not None else _put(watch, raw))

        return await self._open(subject, types, after_seq, recheck_s, hand)

    async def _open(
        self,
        subject: str,
        types: Types,
        after_seq: int | None,
        recheck_s: float,
        hand: Callable[[Watch[T], RawEvent], Awaitable[None]],
    ) -> Watch[T]:
        if after_seq is not None and after_seq < 0:
            raise ValueError(f"after_seq must be 0 or more, got {after_seq}")
        watch: Watch[T] = Watch(after_seq or 0, _tags(types))
        watch._sub = await self._nc.subscribe(subject, cb=watch._ring)
        try:
            await self._nc.flush(timeout=math.ceil(self._timeout))  # held: what is stored now rings
            if after_seq is None:
                watch.last_seq = await self._stored_upto(subject)
        except BaseException:
            await watch.close()
            raise
        watch._pump = asyncio.create_task(
            self._run(watch, subject, recheck_s, hand), name=f"watch {subject}"
        )
        return watch

    async def _run(
        self,
        watch: Watch[T],
        subject: str,
        recheck_s: float,
        hand: Callable[[Watch[T], RawEvent], Awaitable[None]],
    ) -> None:
        """Read the tail; then, on each ring (or every `recheck_s`), read it again."""
        while True:
            watch._bell.clear()
            await self._read_tail(watch, subject, hand)
            if watch._rung:
                await self._confirm(watch, subject, hand)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(recheck_s):
                    await watch._bell.wait()

    async def _confirm(
        self, watch: Watch[T], subject: str, hand: Callable[[Watch[T], RawEvent], Awaitable[None]]
    ) -> None:
        """Events core NATS announced that the read did not find: core NATS may be ahead of
        the stream. Read again, with a growing pause, until each shows or `CONFIRM_S` passes
        (then it was a publish the stream refused)."""
        pause, waited = 0.005, 0.0
        while watch._rung and waited < CONFIRM_S:
            await asyncio.sleep(pause)
            waited += pause
            await self._read_tail(watch, subject, hand)
            pause = min(pause * 2, 0.2)
        watch._rung.clear()

    async def _read_tail(
        self, watch: Watch[T], subject: str, hand: Callable[[Watch[T], RawEvent], Awaitable[None]]
    ) -> None:
        try:
            async for raw in self.read_raw(
                subject, from_seq=watch.last_seq + 1, up_to_seq=NO_LIMIT
            ):
                watch.last_seq = raw.seq
                watch._rung.discard(raw.headers.get(MSG_ID, ""))
                if watch.wanted(raw.headers):
                    await hand(watch, raw)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the server away: the next ring or recheck reads again
            log.warning("watch read failed", extra={"subject": subject, "error": repr(exc)})
        watch._rung.discard("")  # an announcement with no event id: one read answers it

    async def _stored_upto(self, subject: str) -> int:
        """A sequence at or after the last event stored on `subject` now: the subject's own
        last (one direct get) or, for a wildcard, the stream's."""
        if subjects.is_wildcard(subject):
            info = await self._js.stream_info(self._stream)
            return int(info.state.last_seq)
        last = await self._last_raw(subject)
        return (last.seq or 0) if last is not None else 0


async def _put(watch: Watch[T], item: T) -> None:
    watch._queue.put_nowait(item)
