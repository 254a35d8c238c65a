"""Ledgers on the event store: cached folds, group commits, re-decide on a lost race.

Each replica keeps the state and head of the ledgers it touched. Decisions are appended with
`expect=<cached head>`; if another replica appended first the store raises `AppendConflict`,
and the replica folds the tail it missed and decides again (bounded attempts with jittered
backoff, by stamina). A ledger that lost a race is marked contended: until a catch-up finds
nothing new, the replica reads the tail before appending (one round trip) instead of losing
the race again (a failed append, the store's read-back and a catch-up).

So the store's sequence check, not any replica's memory, keeps grants under the limit; the
cache only saves reads.

Requests on one ledger that arrive while an append is in flight wait in a queue; the next
commit decides them in order against a scratch copy of the state and appends all their events
as one atomic batch. One round trip then answers many requests, and a lost race costs one
catch-up for the whole batch instead of one per request.
"""

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import stamina

from fleet_budget.domain import Decision
from fleet_budget.errors import Contended, Malformed
from fleet_events import Actor, Envelope, Event, utc_now
from fleet_mesh.store import (
    EMPTY,
    AppendConflict,
    DuplicateElsewhere,
    EventStore,
    Head,
    StoredEvent,
)

S = TypeVar("S", bound="Indexed")

MAX_BATCH = 256

Decide = Callable[[S], Decision]
Wrap = Callable[[S, Event], Envelope[Any]]


@dataclass
class Cached(Generic[S]):
    state: S
    head: Head = EMPTY
    contended: bool = False
    """Another replica wrote here lately: catch up before appending rather than lose a race."""


@dataclass
class _Pending(Generic[S]):
    request_id: str
    decide: Callable[[S], Decision]
    wrap: Callable[[S, Event], Envelope[Any]]
    answer: "asyncio.Future[Decision]"


@dataclass
class _Slot(Generic[S]):
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    queue: list[_Pending[S]] = field(default_factory=list)
    users: int = 0


class Indexed(Protocol):
    """A ledger's state remembers the decision of every request id it has seen."""

    decisions: dict[str, Event]


class _Retry(Exception):
    """This commit must start over on a caught-up state."""


class Ledgers(Generic[S]):
    """One kind of ledger (trees, or tenant days): cache, commit queues, tail folding."""

    def __init__(
        self,
        store: EventStore,
        *,
        initial: Callable[[], S],
        evolve: Callable[[S, str, Event], S],
        clone: Callable[[S], S],
        stale: tuple[type[Exception], ...] = (),
        capacity: int,
        attempts: int,
        deadline_s: float,
    ) -> None:
        self._store = store
        self._initial = initial
        self._evolve = evolve
        self._clone = clone
        self._stale = stale
        self._capacity = capacity
        self._attempts = attempts
        self._deadline_s = deadline_s
        self._cache: OrderedDict[str, Cached[S]] = OrderedDict()
        self._slots: dict[str, _Slot[S]] = {}

    # --- reading --------------------------------------------------------------------------

    async def current(self, subject: str, *, fresh: bool = False) -> Cached[S]:
        """This replica's fold of `subject` (loaded on first use; caught up if `fresh`).

        The returned object is live: read it at once, never keep or mutate it. A cached,
        not-fresh read takes no lock, so it never waits behind a commit in flight.
        """
        cached = self._cache.get(subject)
        if cached is not None and not fresh:
            return cached
        slot = self._enter(subject)
        try:
            async with slot.lock:
                cached = await self._load(subject)
                if fresh:
                    await self._catch_up(subject, cached)
                return cached
        finally:
            self._leave(subject, slot)

    async def _load(self, subject: str) -> Cached[S]:
        cached = self._cache.get(subject)
        if cached is None:
            cached = Cached(self._initial())
            await self._catch_up(subject, cached)
            self._cache[subject] = cached
            while len(self._cache) > self._capacity:
                self._cache.popitem(last=False)
        self._cache.move_to_end(subject)
        return cached

    async def _catch_up(self, subject: str, cached: Cached[S]) -> bool:
        """Fold in whatever other replicas appended since this replica's head.

        `EventStore.tail` reads with batched direct gets and no head lookup: a lost race costs
        one round trip however many events the winner appended, and no consumer is created (a
        consumer per catch-up is slow under contention and can hit the server's consumer
        limit). Returns whether anything was folded in.
        """
        before = cached.head
        async for stored in self._store.tail(subject, after_seq=cached.head.seq):
            self._apply(cached, stored)
        return cached.head != before

    def _apply(self, cached: Cached[S], stored: StoredEvent) -> None:
        cached.state = self._evolve(cached.state, stored.envelope.id, stored.envelope.data)
        cached.head = Head(stored.seq, stored.hash)

    # --- writing --------------------------------------------------------------------------

    async def submit(
        self, subject: str, request_id: str, decide: Decide[S], wrap: Wrap[S]
    ) -> Decision:
        """Decide and append one request's event, in a group commit with its neighbours."""
        answer: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        slot = self._enter(subject)
        slot.queue.append(_Pending(request_id, decide, wrap, answer))
        try:
            while not answer.done():
                async with slot.lock:
                    if slot.queue:
                        batch, slot.queue = slot.queue[:MAX_BATCH], slot.queue[MAX_BATCH:]
                        await self._commit(subject, batch)
        finally:
            self._leave(subject, slot)
        return answer.result()

    async def _commit(self, subject: str, batch: list[_Pending[S]]) -> None:
        try:
            cached = await self._load(subject)
            if cached.contended:  # one read now is cheaper than a lost race and its read-back
                cached.contended = await self._catch_up(subject, cached)
            singly = [False]
            if await self._attempt(subject, cached, batch, singly):
                return  # the common case, without the retry machinery's overhead
            async for attempt in stamina.retry_context(
                on=_Retry,
                attempts=self._attempts - 1,
                timeout=self._deadline_s,
                wait_initial=0.0005,
                wait_max=0.02,
                wait_jitter=0.002,
            ):
                with attempt:
                    if not await self._attempt(subject, cached, batch, singly):
                        raise _Retry
        except _Retry:
            self._fail(batch, lambda p: Contended(
                f"{subject} kept changing under {self._attempts} attempts; retry the same "
                f"request (request_id {p.request_id!r}): it will be answered exactly once"
            ))  # fmt: skip
        except BaseException as exc:  # the store failed: every waiter learns it, none hangs
            failure = exc
            self._fail(batch, lambda _: failure)
            if not isinstance(exc, Exception):
                raise

    async def _attempt(
        self, subject: str, cached: Cached[S], batch: list[_Pending[S]], singly: list[bool]
    ) -> bool:
        """One try; False when it must be retried on the caught-up state."""
        head = cached.head
        try:
            await self._try_commit(subject, cached, batch, singly=singly[0])
        except AppendConflict:
            cached.contended = True
            # Refused although nothing new was on the ledger: one of the batch's ids is already
            # in the stream (used on another ledger). Commit one at a time to isolate it.
            singly[0] = singly[0] or cached.head == head
            return False
        except _Retry:
            return False
        return True

    @staticmethod
    def _fail(batch: list[_Pending[S]], error: Callable[[_Pending[S]], BaseException]) -> None:
        for pending in batch:
            if not pending.answer.done():
                pending.answer.set_exception(error(pending))

    async def _try_commit(
        self, subject: str, cached: Cached[S], batch: list[_Pending[S]], *, singly: bool
    ) -> None:
        pending = [p for p in batch if not p.answer.done()]
        if singly:
            for one in pending:
                await self._try_commit(subject, cached, [one], singly=False)
            return
        # Deciding a batch evolves the state before the append lands: do it on a copy.
        scratch = self._clone(cached.state) if len(pending) > 1 else cached.state
        answers: list[tuple[_Pending[S], Decision | Exception]] = []
        envelopes: list[Envelope[Any]] = []
        for one in pending:
            try:
                decision = one.decide(scratch)
            except self._stale as exc:
                if not await self._catch_up(subject, cached):
                    answers.append((one, exc))  # truly unknown: caught up, still not there
                    continue
                raise _Retry from exc
            except Exception as exc:  # malformed: this request only
                answers.append((one, exc))
                continue
            if decision.new:
                envelopes.append(one.wrap(scratch, decision.event))
                if len(pending) > 1:
                    scratch = self._evolve(scratch, one.request_id, decision.event)
            answers.append((one, decision))
        if envelopes:
            try:
                stored = await self._store.append_batch(subject, envelopes, expect=cached.head)
            except AppendConflict:
                await self._catch_up(subject, cached)
                raise
            except DuplicateElsewhere:  # a single event whose id another ledger already has
                self._reject_foreign(subject, cached, envelopes, answers)
                raise _Retry from None
            if any(s.duplicate for s in stored):
                # Ours, stored before a lost ack (the store checked every id of the batch):
                # decide again from the ledger as it is, which now answers from its index.
                await self._catch_up(subject, cached)
                raise _Retry
            if len(pending) == 1:
                scratch = self._evolve(scratch, envelopes[0].id, envelopes[0].data)
            cached.state, cached.head = scratch, stored[-1].head
        for one, outcome in answers:
            if one.answer.done():  # answered as foreign, or its waiter was cancelled
                continue
            if isinstance(outcome, Exception):
                one.answer.set_exception(outcome)
            else:
                one.answer.set_result(outcome)

    def _reject_foreign(
        self,
        subject: str,
        cached: Cached[S],
        envelopes: list[Envelope[Any]],
        answers: list[tuple[_Pending[S], Decision | Exception]],
    ) -> None:
        """An id the stream had, yet not on this ledger: it was used on another one."""
        known = cached.state.decisions
        foreign = {e.id for e in envelopes if e.id not in known}
        for one, _ in answers:
            if one.request_id in foreign and not one.answer.done():
                one.answer.set_exception(
                    Malformed(
                        f"request_id {one.request_id!r} was already used for a request on another "
                        f"ledger than {subject}; every request needs its own request_id"
                    )
                )

    # --- per-ledger slots ---------------------------------------------------------------------

    def _enter(self, subject: str) -> _Slot[S]:
        slot = self._slots.setdefault(subject, _Slot())
        slot.users += 1
        return slot

    def _leave(self, subject: str, slot: _Slot[S]) -> None:
        slot.users -= 1
        if slot.users == 0 and not slot.queue:
            self._slots.pop(subject, None)


def envelope_for(
    actor: Actor, request_id: str, tenant: str, data: Event, **context: str | None
) -> Envelope[Event]:
    return Envelope(id=request_id, tenant=tenant, actor=actor, ts=utc_now(), data=data, **context)
