"""Ledgers on the event store: cached folds, optimistic appends, re-decide on conflict.

Each replica keeps the state and head of the ledgers it touched. A decision is appended with
`expect=<cached head>`; if another replica appended first the store raises `AppendConflict`,
and the replica folds the tail it missed and decides again (bounded attempts with jittered
backoff, by stamina). So the store's sequence check, not any replica's memory, is what keeps
grants under the limit; the cache only saves a replay when this replica is the only writer.

Inside one replica, requests on one ledger take turns behind a per-ledger lock, so the replica
never races itself; requests on different ledgers run concurrently.
"""

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import stamina
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from fleet_budget.domain import Decision
from fleet_budget.errors import Contended, Malformed
from fleet_events import Actor, Envelope, Event, streams, utc_now
from fleet_events.chain import HASH_HEADER, PREV_HEADER
from fleet_events.codec import Codec
from fleet_mesh.store import EMPTY, AppendConflict, EventStore, Head, StoredEvent

S = TypeVar("S")

DIRECT_TAIL = 32


@dataclass
class Cached(Generic[S]):
    state: S
    head: Head = EMPTY


@dataclass
class _KeyedLock:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class Ledgers(Generic[S]):
    """One kind of ledger (trees, or tenant days): cache, locks, tail folding, appends."""

    def __init__(
        self,
        store: EventStore,
        js: JetStreamContext,
        actor: Actor,
        *,
        initial: Callable[[], S],
        evolve: Callable[[S, str, Event], S],
        capacity: int,
        attempts: int,
        deadline_s: float,
    ) -> None:
        self._store = store
        self._js = js
        self._stream = streams.BUDGET.name
        # Budget events are small and never offloaded, so the tail needs no blob store.
        self._codec = Codec()
        self._actor = actor
        self._initial = initial
        self._evolve = evolve
        self._capacity = capacity
        self._attempts = attempts
        self._deadline_s = deadline_s
        self._cache: OrderedDict[str, Cached[S]] = OrderedDict()
        self._locks: dict[str, _KeyedLock] = {}

    @asynccontextmanager
    async def locked(self, subject: str) -> AsyncIterator[Cached[S]]:
        """Hold `subject`'s ledger exclusively in this replica; yields its cached fold."""
        entry = self._locks.setdefault(subject, _KeyedLock())
        entry.users += 1
        try:
            async with entry.lock:
                cached = self._cache.get(subject)
                if cached is None:
                    cached = Cached(self._initial())
                    await self.catch_up(subject, cached)
                    self._remember(subject, cached)
                yield cached
        finally:
            entry.users -= 1
            if entry.users == 0:
                del self._locks[subject]

    def forget(self, subject: str) -> None:
        self._cache.pop(subject, None)

    def _remember(self, subject: str, cached: Cached[S]) -> None:
        self._cache[subject] = cached
        self._cache.move_to_end(subject)
        while len(self._cache) > self._capacity:
            self._cache.popitem(last=False)

    async def catch_up(self, subject: str, cached: Cached[S]) -> None:
        """Fold in whatever other replicas appended since this replica's head.

        A lost race usually leaves a short tail, read with direct gets (~0.2 ms each, no
        consumer); a long one (a first load) switches to the store's replay. Under contention
        a consumer per catch-up would be slow and can hit the server's consumer limit.
        """
        for _ in range(DIRECT_TAIL):
            try:
                raw = await self._js.get_msg(
                    self._stream, seq=cached.head.seq + 1, subject=subject, next=True, direct=True
                )
            except NotFoundError:
                return
            headers = dict(raw.headers or {})
            stored = StoredEvent(
                subject=subject,
                seq=raw.seq or 0,
                envelope=self._codec.decode_stored(raw.data or b""),
                hash=headers.get(HASH_HEADER, ""),
                prev_hash=headers.get(PREV_HEADER, ""),
            )
            self._apply(cached, stored)
        async for stored in self._store.replay(subject, from_seq=cached.head.seq + 1):
            self._apply(cached, stored)

    def _apply(self, cached: Cached[S], stored: StoredEvent) -> None:
        cached.state = self._evolve(cached.state, stored.envelope.id, stored.envelope.data)
        cached.head = Head(stored.seq, stored.hash)

    async def decide_and_append(
        self,
        subject: str,
        cached: Cached[S],
        request_id: str,
        decide: Callable[[S], Decision],
        envelope: Callable[[S, Event], Envelope[Any]],
    ) -> Decision:
        """Append `decide`'s answer after the cached head; on a lost race, catch up and redo."""
        try:
            async for attempt in stamina.retry_context(
                on=AppendConflict,
                attempts=self._attempts,
                timeout=self._deadline_s,
                wait_initial=0.001,
                wait_max=0.05,
                wait_jitter=0.01,
            ):
                with attempt:
                    return await self._try_append(subject, cached, request_id, decide, envelope)
        except AppendConflict as exc:
            raise Contended(
                f"{subject} kept changing under {self._attempts} attempts; retry the same "
                f"request (request_id {request_id!r}) and it will be answered exactly once"
            ) from exc
        raise AssertionError("unreachable: stamina either returns or raises")  # pragma: no cover

    async def _try_append(
        self,
        subject: str,
        cached: Cached[S],
        request_id: str,
        decide: Callable[[S], Decision],
        envelope: Callable[[S, Event], Envelope[Any]],
    ) -> Decision:
        decision = decide(cached.state)
        if not decision.new:
            return decision
        try:
            appended = await self._store.append(
                subject, envelope(cached.state, decision.event), expect=cached.head
            )
        except AppendConflict:
            await self.catch_up(subject, cached)
            raise
        if appended.duplicate:
            # Our own earlier write whose ack was lost: the ledger holds the original decision.
            await self.catch_up(subject, cached)
            again = decide(cached.state)
            if again.new:
                # The stream deduplicates ids across subjects: this id was used on another one.
                raise Malformed(
                    f"request_id {request_id!r} was already used for a request on another "
                    f"ledger than {subject}; every request needs its own request_id"
                )
            return again
        cached.state = self._evolve(cached.state, request_id, decision.event)
        cached.head = appended.head
        return decision


def envelope_for(
    actor: Actor, request_id: str, tenant: str, data: Event, **context: str | None
) -> Envelope[Event]:
    return Envelope(id=request_id, tenant=tenant, actor=actor, ts=utc_now(), data=data, **context)


Call = Callable[[], Awaitable[Decision]]
