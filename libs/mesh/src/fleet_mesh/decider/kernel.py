"""The decider kernel's driver: cached folds, group commits, re-decide on a lost race.

Each replica keeps the state and head of the subjects it touched (an LRU of `capacity`).
Decisions are appended with `expect=<cached head>`; if another writer appended first the store
raises `AppendConflict`, and the replica folds the tail it missed and decides again (bounded
attempts with jittered backoff, by stamina). A subject that lost a race is marked contended:
until a catch-up finds nothing new, the replica reads the tail before appending (one round
trip) instead of losing the race again (a failed append, the store's read-back and a
catch-up). So the store's sequence check, not any replica's memory, is what makes a decision
hold; the cache only saves reads.

Requests on one subject that arrive while an append is in flight wait in a queue; the next
commit decides them in order on a scratch copy of the state (`plan`) and appends all their
events as one atomic batch: one round trip answers many requests, and a lost race costs one
catch-up for the whole batch.
"""

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import stamina
from cachetools import LRUCache

from fleet_events import Envelope, Event
from fleet_events.catalog import BY_TAG
from fleet_events.chain import HASH_HEADER, PREV_HEADER, TYPE_HEADER
from fleet_mesh.decider.errors import Contended, IdUsedElsewhere
from fleet_mesh.decider.plan import Decided, Ledger, Plan, Request, chains_on, plan
from fleet_mesh.store import (
    EMPTY,
    AppendConflict,
    Appended,
    DuplicateElsewhere,
    EventStore,
    Head,
    Loaded,
    StoredEvent,
)
from fleet_mesh.store.reads import NO_LIMIT

log = logging.getLogger("fleet.decider")

S = TypeVar("S")
D = TypeVar("D", bound=Decided)

MAX_BATCH = 256


@dataclass
class Cached(Generic[S]):
    state: S
    head: Head = EMPTY
    contended: bool = False
    """Another writer wrote here lately: catch up before appending rather than lose a race."""


@dataclass
class _Pending(Generic[S]):
    request: Request[S, Any]
    answer: "asyncio.Future[Any]"
    fresh: bool = False


@dataclass
class _Slot(Generic[S]):
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    queue: list[_Pending[S]] = field(default_factory=list)
    users: int = 0


class _Retry(Exception):
    """This commit must start over on a caught-up state."""


class _Purged(Exception):
    """The subject's tail does not continue the cached fold: it was purged since."""


class _AsFold(Generic[S]):
    """A `Ledger` as the store's snapshot `Fold`."""

    def __init__(self, ledger: Ledger[S], state_type: type[S]) -> None:
        self.name = ledger.name
        self.version = ledger.version
        self.state_type = state_type
        self._ledger = ledger

    def initial(self) -> S:
        return self._ledger.initial()

    def evolve(self, state: S, event: StoredEvent) -> S:
        return self._ledger.evolve(state, event)


class Decider(Generic[S]):
    """One kind of subject (a tree's ledger, a session's log): cache, commit queues, tails."""

    def __init__(
        self,
        store: EventStore,
        ledger: Ledger[S],
        *,
        stale: tuple[type[Exception], ...] = (),
        capacity: int = 1024,
        attempts: int = 16,
        deadline_s: float = 5.0,
        max_batch: int = MAX_BATCH,
        snapshot_after: int | None = None,
    ) -> None:
        if snapshot_after is not None and ledger.state_type is None:
            raise ValueError(f"ledger {ledger.name!r} needs a state_type to be snapshotted")
        self._store = store
        self._ledger = ledger
        self._stale = stale
        self._attempts = attempts
        self._deadline_s = deadline_s
        self._max_batch = max_batch
        self._snapshot_after = snapshot_after
        self._cache: LRUCache[str, Cached[S]] = LRUCache(maxsize=capacity)
        self._slots: dict[str, _Slot[S]] = {}
        self._unknown_seen: set[str] = set()

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

    def forget(self, subject: str) -> None:
        """Drop a cached fold: the next use folds the subject again (from its snapshot)."""
        self._cache.pop(subject, None)

    async def _load(self, subject: str) -> Cached[S]:
        cached = self._cache.get(subject)  # a get marks it recently used
        if cached is not None:
            return cached
        cached = Cached(self._ledger.initial())
        await self._restart(subject, cached)
        fold = self._as_fold()
        if fold is not None:
            loaded = await self._store.read_snapshot(subject, fold)
            if loaded is not None:
                cached.state, cached.head = loaded.state, loaded.head(subject)
        folded = await self._fold_tail(subject, cached)
        if fold is not None and self._snapshot_after is not None and folded > self._snapshot_after:
            snapshot = Loaded(cached.state, seq=cached.head.seq, heads={subject: cached.head})
            try:
                await self._store.save_snapshot(subject, fold, snapshot)
            except Exception:  # the fold is right; only the next load will be slower
                log.warning("snapshot not saved", exc_info=True, extra={"subject": subject})
        self._cache[subject] = cached
        return cached

    def _as_fold(self) -> _AsFold[S] | None:
        if self._snapshot_after is None or self._ledger.state_type is None:
            return None
        return _AsFold(self._ledger, self._ledger.state_type)

    async def _catch_up(self, subject: str, cached: Cached[S]) -> bool:
        """Fold in whatever others appended since the cached head; whether anything was."""
        return await self._fold_tail(subject, cached) > 0

    async def _fold_tail(self, subject: str, cached: Cached[S]) -> int:
        """One round trip for a short tail (batched direct gets, no head lookup, no consumer:
        a consumer per catch-up is slow under contention and can hit the server's limit).
        A tail that does not chain on the cached head means a purge: fold from the start."""
        try:
            return await self._read_tail(subject, cached)
        except _Purged:
            await self._restart(subject, cached)
            return await self._read_tail(subject, cached)

    async def _restart(self, subject: str, cached: Cached[S]) -> None:
        """Start the fold over: from nothing, or (a ledger that does not replay) at the head."""
        cached.state = self._ledger.initial()
        cached.head = EMPTY if self._ledger.replay else await self._store.head(subject)

    async def _read_tail(self, subject: str, cached: Cached[S]) -> int:
        types, folded = self._ledger.types, 0
        tail = self._store.read_raw(subject, from_seq=cached.head.seq + 1, up_to_seq=NO_LIMIT)
        async for raw in tail:
            if folded == 0 and not chains_on(cached.head, raw.headers.get(PREV_HEADER)):
                raise _Purged
            folded += 1
            kind = raw.headers.get(TYPE_HEADER, "")
            if types is None or kind in types:
                stored = await self._store.decoded(raw)
                cached.state = self._ledger.evolve(cached.state, stored)
            elif kind not in BY_TAG:
                self._note_unknown(kind, subject)
            cached.head = Head(raw.seq, raw.headers.get(HASH_HEADER, ""))
        return folded

    def _note_unknown(self, kind: str, subject: str) -> None:
        if kind not in self._unknown_seen:
            self._unknown_seen.add(kind)
            log.warning(
                "skipping an event type this replica does not fold",
                extra={"type": kind, "subject": subject, "fold": self._ledger.name},
            )

    # --- writing --------------------------------------------------------------------------

    async def submit(
        self,
        subject: str,
        decide: Callable[[S], D],
        wrap: Callable[[S, Event], Envelope[Any]],
        *,
        request_id: str | None = None,
        fresh: bool = False,
    ) -> D:
        """Decide on the subject's fold and append the decision's events (`decide(state)
        .events`), in a group commit with its neighbours; the decision is returned once its
        events are stored (or when it stores none). A lost race folds again and decides again.
        `fresh`: read the tail before deciding, for a decision that may store nothing yet
        depends on the latest events (a store-nothing answer is never checked by an append).
        Raises what `decide` raised (nothing stored), `Contended` when every attempt lost,
        `IdUsedElsewhere` when an event id is already on another subject, or a store error."""
        decision, _ = await self.place(subject, Request(request_id, decide, wrap), fresh=fresh)
        return decision

    async def place(
        self, subject: str, request: Request[S, D], *, fresh: bool = False
    ) -> tuple[D, tuple[Appended, ...]]:
        """`submit` of a `Request`, answered with where the decision's own events were stored
        (in order; none when it stored nothing)."""
        answer: asyncio.Future[tuple[D, tuple[Appended, ...]]]
        answer = asyncio.get_running_loop().create_future()
        slot = self._enter(subject)
        slot.queue.append(_Pending(request, answer, fresh))
        try:
            while not answer.done():
                async with slot.lock:
                    if slot.queue:
                        cut = self._max_batch
                        batch, slot.queue = slot.queue[:cut], slot.queue[cut:]
                        await self._commit(subject, batch)
        finally:
            self._leave(subject, slot)
        return answer.result()

    async def _commit(self, subject: str, batch: list[_Pending[S]]) -> None:
        try:
            cached = await self._load(subject)
            if cached.contended:  # one read now is cheaper than a lost race and its read-back
                cached.contended = await self._catch_up(subject, cached)
            elif any(p.fresh for p in batch):
                await self._catch_up(subject, cached)
            singly = [False]
            if await self._attempt(subject, cached, batch, singly):
                return  # the common case, without the retry machinery's overhead
            if self._attempts < 2:
                raise _Retry
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
            self._fail(batch, lambda p: Contended(subject, self._attempts, p.request.request_id))
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
            # Refused although nothing new was on the subject: one of the batch's ids is
            # already in the stream (used on another subject). Commit one at a time to find it.
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
        requests = [p.request for p in pending]
        planned = plan(self._ledger, subject, cached.state, requests, stale=self._stale)
        if planned.stale is not None:
            if await self._catch_up(subject, cached):
                raise _Retry
            # caught up and still stale: the answer stands (the same plan, now final)
            planned = plan(
                self._ledger, subject, cached.state, requests, stale=self._stale, caught_up=True
            )
        placed: dict[int, list[Appended]] = {}
        if planned.envelopes:
            stored = await self._append(subject, cached, pending, planned)
            for owner, appended in zip(planned.owners, stored, strict=True):
                placed.setdefault(owner, []).append(appended)
        for index, outcome in planned.answers.items():
            one = pending[index]
            if one.answer.done():  # answered as foreign, or its waiter was cancelled
                continue
            if isinstance(outcome, Exception):
                one.answer.set_exception(outcome)
            else:
                one.answer.set_result((outcome, tuple(placed.get(index, ()))))

    async def _append(
        self, subject: str, cached: Cached[S], pending: list[_Pending[S]], planned: Plan[S, Any]
    ) -> list[Appended]:
        envelopes = planned.envelopes
        try:
            stored = await self._store.append_batch(subject, envelopes, expect=cached.head)
        except AppendConflict as exc:
            if exc.actual is not None and exc.actual < cached.head.seq:
                await self._restart(subject, cached)  # the subject was purged: start over
            await self._catch_up(subject, cached)
            raise
        except DuplicateElsewhere:  # a single event whose id another subject already has
            owner = pending[planned.owners[0]]
            if not owner.answer.done():
                owner.answer.set_exception(
                    IdUsedElsewhere(subject, owner.request.request_id or envelopes[0].id)
                )
            raise _Retry from None
        if any(s.duplicate for s in stored):
            # Ours, stored before a lost ack (the store checked every id of the batch): decide
            # again from the subject as it is, which now answers from the fold.
            await self._catch_up(subject, cached)
            raise _Retry
        if len(pending) > 1:
            cached.state = planned.state  # the scratch copy, evolved while planning
        else:
            prev = cached.head.hash
            for envelope, appended in zip(envelopes, stored, strict=True):
                event = StoredEvent(subject, appended.seq, envelope, appended.hash, prev)
                cached.state = self._ledger.evolve(cached.state, event)
                prev = appended.hash
        cached.head = stored[-1].head
        return stored

    # --- per-subject slots ----------------------------------------------------------------

    def _enter(self, subject: str) -> _Slot[S]:
        slot = self._slots.setdefault(subject, _Slot())
        slot.users += 1
        return slot

    def _leave(self, subject: str, slot: _Slot[S]) -> None:
        slot.users -= 1
        if slot.users == 0 and not slot.queue:
            self._slots.pop(subject, None)
