"""Work-queue consumption: a shared durable pull consumer, a bounded number of slots per
replica, progress while a handler runs, and delivery settled only by the handler's answer.

Why not a library's subscriber: FastStream 0.7.8 terminates a message when a handler raises
and over-fetches with `max_workers` (docs/architecture.md, "Departures"). Here nothing is
fetched without a free slot, so a replica never holds work it cannot start (another replica
gets it), and a message is settled exactly as the handler says:

- `Settle.ACK`: done (its outcome is stored); the work queue forgets it.
- `Settle.NAK`: give it to any replica again now (this one is stopping).
- `Settle.TERM`: never deliver it again (it can never be handled: malformed).
- `Settle.LEAVE`: touch nothing. The delivery is no longer ours (another replica took over
  after our ack deadline passed): acking it would ack the new owner's delivery.
- `Retry(delay_s)`: give it back to be delivered again after `delay_s` (a collector that
  refused it now may take it later).

While a handler runs, `in_progress` is sent every `progress_every_s` (a third of the ack
deadline by default), so a long handler is not redelivered while its replica lives; a replica
that dies or freezes stops sending, and the message goes to another replica after `ack_wait`.
A handler that raises is logged and its message redelivered after the ack deadline (NAK with a
delay, never a tight loop); `max_deliver` bounds how often. A fetch that fails for another
reason than an empty queue (the consumer gone with a server's store, a connection down) is
followed by a pause and the consumer created again from its spec, so a consumer outlives both.

`ServiceContext.consume(spec, handler, ...)` is how a service starts one: it stops with the
service.
"""

import asyncio
import contextlib
import enum
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext

from fleet_events.streams import ConsumerSpec
from fleet_mesh.bootstrap import ensure_consumer


class Settle(enum.Enum):
    ACK = "ack"
    NAK = "nak"
    TERM = "term"
    LEAVE = "leave"


@dataclass(frozen=True)
class Delivery:
    """One delivery of a work item: its bytes and how many times it has been delivered."""

    subject: str
    data: bytes
    headers: dict[str, str]
    stream_seq: int
    attempt: int
    """The server's delivery count: 1 the first time, more after redeliveries."""


@dataclass(frozen=True)
class Retry:
    """Deliver it again, to any replica, after `delay_s` (NAK with a delay)."""

    delay_s: float


Handler = Callable[[Delivery], Awaitable[Settle | Retry]]


@dataclass
class WorkStats:
    """Counters for ping details and tests: what a replica's slots have done so far."""

    running: int = 0
    peak: int = 0
    handled: int = 0
    progress_sent: int = 0
    failed: int = 0
    lent: int = 0
    """Slots handlers have lent back while they wait (`WorkConsumer.lend_slot`)."""
    busy_peak: int = 0
    """The most handlers holding a slot at once (running, less those lent back)."""

    def note_busy(self) -> None:
        self.busy_peak = max(self.busy_peak, self.running - self.lent)


class WorkConsumer:
    def __init__(
        self,
        js: JetStreamContext,
        spec: ConsumerSpec,
        handler: Handler,
        *,
        slots: int,
        log: logging.Logger,
        progress_every_s: float | None = None,
        poll_s: float = 5.0,
        batch: int = 1,
        sync_ack: bool = True,
    ) -> None:
        """`batch`: messages fetched per free slot, handled one after another in it (a
        consumer that mostly acks what it skips costs one round trip per batch, not per
        message). `sync_ack`: an ack waits for the server's confirmation before the slot is
        free (a turn's end); without, it is sent and the next message taken at once."""
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        if batch < 1:
            raise ValueError(f"batch must be at least 1, got {batch}")
        self._js = js
        self._spec = spec
        self._handler = handler
        self._slots = asyncio.Semaphore(slots)
        self.slots = slots
        self._log = log
        self._progress_every = progress_every_s or spec.ack_wait_s / 3
        self._poll = poll_s
        self._batch = batch
        self._sync_ack = sync_ack
        self._loop: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = False
        self.stats = WorkStats()

    async def start(self) -> None:
        """Apply the spec's ack deadline and delivery bound (this service's settings) to the
        shared consumer, then pull whenever a slot is free."""
        await ensure_consumer(self._js, self._spec, update=True)
        sub = await self._js.pull_subscribe_bind(self._spec.durable, stream=self._spec.stream)
        self._loop = asyncio.create_task(self._pull(sub), name=f"pull {self._spec.durable}")

    async def _pull(self, sub: JetStreamContext.PullSubscription) -> None:
        while not self._stopping:
            await self._slots.acquire()
            try:
                msgs = await sub.fetch(self._batch, timeout=self._poll)
            except (TimeoutError, NatsTimeout):
                self._slots.release()
                continue
            except asyncio.CancelledError:
                self._slots.release()
                raise
            except Exception:
                self._slots.release()
                self._log.warning("fetch failed", exc_info=True)
                await asyncio.sleep(min(1.0, self._poll))  # a broken connection: do not spin
                await self._recreate()
                continue
            task = asyncio.create_task(self._handle_all(msgs))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _recreate(self) -> None:
        """The consumer again from its spec, if it is gone (an existing one is left as it is)."""
        try:
            await ensure_consumer(self._js, self._spec, update=True)
        except Exception as exc:  # still no server: the next fetch fails and comes back here
            self._log.warning("consumer not recreated", extra={"error": type(exc).__name__})

    async def _handle_all(self, msgs: list[Msg]) -> None:
        """A fetched batch, in order; once stopping, what is left goes back at once (NAK)."""
        handed = 0
        try:
            for msg in msgs:
                if self._stopping:
                    break
                handed += 1
                await self._handle(msg)
        finally:
            for rest in msgs[handed:]:
                with contextlib.suppress(Exception):
                    await rest.nak()
            self._slots.release()

    async def _handle(self, msg: Msg) -> None:
        self.stats.running += 1
        self.stats.peak = max(self.stats.peak, self.stats.running)
        self.stats.note_busy()
        progress = asyncio.create_task(self._report_progress(msg))
        settle: Settle | Retry = Settle.NAK
        try:
            meta = msg.metadata
            delivery = Delivery(
                subject=msg.subject,
                data=msg.data,
                headers=dict(msg.headers or {}),
                stream_seq=meta.sequence.stream,
                attempt=meta.num_delivered,
            )
            settle = await self._handler(delivery)
        except asyncio.CancelledError:
            settle = Settle.NAK  # stopping mid-handler: another replica takes it now
            raise
        except Exception:
            self.stats.failed += 1
            self._log.exception("work handler failed", extra={"subject": msg.subject})
            settle = Settle.LEAVE
            with contextlib.suppress(Exception):
                await msg.nak(delay=self._spec.ack_wait_s)
        finally:
            progress.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await progress
            with contextlib.suppress(Exception):
                await self._settle(msg, settle)
            self.stats.running -= 1
            self.stats.handled += 1

    def lend_slot(self) -> None:
        """A running handler gives its slot back while it waits on work it published itself
        (a parent run waiting on its child runs), so that work can run here meanwhile: a
        replica whose every slot held a waiting parent would otherwise never run the
        children they wait for. The handler calls `reclaim_slot` before it goes on. Call
        both on this consumer's loop."""
        self._slots.release()
        self.stats.lent += 1

    async def reclaim_slot(self) -> None:
        await self._slots.acquire()
        self.stats.lent -= 1
        self.stats.note_busy()

    async def _settle(self, msg: Msg, settle: "Settle | Retry") -> None:
        if isinstance(settle, Retry):
            await msg.nak(delay=settle.delay_s)
        elif settle is Settle.ACK:
            await (msg.ack_sync() if self._sync_ack else msg.ack())
        elif settle is Settle.NAK:
            await msg.nak()
        elif settle is Settle.TERM:
            await msg.term()

    async def _report_progress(self, msg: Msg) -> None:
        while True:
            await asyncio.sleep(self._progress_every)
            try:
                await msg.in_progress()
                self.stats.progress_sent += 1
            except Exception:
                self._log.warning("progress report failed", exc_info=True)

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop pulling; give running handlers `grace_s`, then cancel them (their messages
        are handed back, NAK, for another replica to take at once)."""
        self._stopping = True
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=grace_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=grace_s)
