"""The decider kernel on a real JetStream store: races, re-decides, ids, batches, snapshots."""

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec
import pytest
from nats.js import JetStreamContext

from fleet_events import Actor, Envelope, Event, new_id, streams, utc_now
from fleet_events.catalog import type_of_class
from fleet_events.session import SessionRenamed, TurnRequested, log_subject
from fleet_mesh.decider import (
    Contended,
    Decider,
    Decision,
    IdUsedElsewhere,
    Ledger,
    Request,
)
from fleet_mesh.store import EventStore, StoredEvent, open_store

ACTOR = Actor(service="test", replica="t-0")


class Slots(msgspec.Struct, kw_only=True):
    """A subject's fold: who took a slot (by request id), up to `LIMIT`."""

    taken: list[str] = msgspec.field(default_factory=list)
    renamed: int = 0


LIMIT = 25


@dataclass
class Counting:
    """Counts the events each ledger folds, to see what was read from where."""

    folded: list[int] = field(default_factory=list)

    def ledger(self, **options: Any) -> Ledger[Slots]:
        def evolve(state: Slots, stored: StoredEvent) -> Slots:
            self.folded.append(stored.seq)
            if isinstance(stored.envelope.data, TurnRequested):
                state.taken.append(stored.envelope.data.message)
            elif isinstance(stored.envelope.data, SessionRenamed):
                state.renamed += 1
            return state

        return Ledger(
            name="test-slots", initial=Slots, evolve=evolve, state_type=Slots,
            clone=lambda s: msgspec.structs.replace(s, taken=list(s.taken)), **options,
        )  # fmt: skip


@pytest.fixture
async def store(js: JetStreamContext) -> EventStore:
    return await open_store(js, streams.SESSIONS)


@pytest.fixture
def subject() -> str:
    return log_subject("acme", new_id())


def envelope(
    subject: str, data: Event, event_id: str | None = None, *, raw_id: str | None = None
) -> Envelope[Event]:
    """An event of `subject`'s session; `event_id` is made unique to the session (ids are
    unique stream-wide and tests share one server), `raw_id` is used as it is."""
    session = subject.split(".")[3]
    unique = raw_id or (f"{session[:12]}-{event_id}" if event_id else new_id())
    return Envelope(id=unique, tenant="acme", session=session, actor=ACTOR, ts=utc_now(),
                    data=data)  # fmt: skip


def taken_in(events: list[StoredEvent]) -> list[str]:
    """The request ids of the slots taken, in the log's order."""
    return [e.envelope.data.message for e in events if isinstance(e.envelope.data, TurnRequested)]


@dataclass(frozen=True)
class Took:
    answer: str
    events: tuple[Event, ...] = ()


def take(request_id: str, calls: list[Slots] | None = None) -> Callable[[Slots], Took]:
    def decide(state: Slots) -> Took:
        if calls is not None:
            calls.append(msgspec.structs.replace(state, taken=list(state.taken)))
        if request_id in state.taken:
            return Took("already")
        if len(state.taken) >= LIMIT:
            return Took("full")
        return Took("taken", (TurnRequested(message=request_id),))

    return decide


async def submit(
    decider: Decider[Slots],
    subject: str,
    request_id: str,
    *,
    calls: list[Slots] | None = None,
    raw_id: str | None = None,
) -> Took:
    return await decider.submit(
        subject,
        take(request_id, calls),
        lambda _, event: envelope(subject, event, request_id, raw_id=raw_id),
        request_id=request_id,
    )


async def stored(store: EventStore, subject: str) -> list[StoredEvent]:
    return [e async for e in store.replay(subject)]


async def test_two_deciders_racing_one_subject_never_both_win(
    store: EventStore, subject: str
) -> None:
    a, b = (Decider(store, Counting().ledger()) for _ in range(2))
    requests = [new_id()[:16] for _ in range(40)]

    replies = await asyncio.gather(
        *(submit(a if i % 2 else b, subject, rid) for i, rid in enumerate(requests))
    )

    assert [r.answer for r in replies].count("taken") == LIMIT
    assert [r.answer for r in replies].count("full") == len(requests) - LIMIT
    events = await stored(store, subject)
    assert len(events) == LIMIT  # every loser re-decided on the winner's events
    winners = {rid for rid, r in zip(requests, replies, strict=True) if r.answer == "taken"}
    assert set(taken_in(events)) == winners


async def test_a_lost_race_folds_the_tail_and_decides_again(
    store: EventStore, subject: str
) -> None:
    decider = Decider(store, Counting().ledger())
    await submit(decider, subject, "first")  # cached at the head after "first"
    other = await store.append(subject, envelope(subject, TurnRequested(message="other"), "other"))

    calls: list[Slots] = []
    reply = await submit(decider, subject, "mine", calls=calls)

    assert reply.answer == "taken"
    assert [c.taken for c in calls] == [["first"], ["first", "other"]]  # stale, then caught up
    events = await stored(store, subject)
    assert taken_in(events) == ["first", "other", "mine"]
    assert events[2].prev_hash == other.hash
    cached = await decider.current(subject)
    assert (cached.head.seq, cached.head.hash) == (events[2].seq, events[2].hash)


async def test_every_attempt_lost_is_contended_and_stores_nothing(
    store: EventStore, subject: str
) -> None:
    decider = Decider(store, Counting().ledger(), attempts=1)
    await submit(decider, subject, "first")
    await store.append(subject, envelope(subject, TurnRequested(message="other"), "other"))

    with pytest.raises(Contended, match=r"request_id 'mine'.*answered exactly once"):
        await submit(decider, subject, "mine")

    assert taken_in(await stored(store, subject)) == ["first", "other"]
    assert (await submit(decider, subject, "mine")).answer == "taken"  # the retry lands


async def test_a_retried_request_id_is_answered_once_by_any_decider(
    store: EventStore, subject: str
) -> None:
    a, b = Decider(store, Counting().ledger()), Decider(store, Counting().ledger())
    assert (await submit(a, subject, "req-1")).answer == "taken"

    assert (await submit(b, subject, "req-1")).answer == "already"  # a replica that never saw it
    assert (await submit(a, subject, "req-1")).answer == "already"
    assert taken_in(await stored(store, subject)) == ["req-1"]


async def test_a_request_stored_before_its_lost_ack_is_recognised_not_stored_twice(
    store: EventStore, subject: str
) -> None:
    decider = Decider(store, Counting().ledger())
    await submit(decider, subject, "first")
    # The same request's event landed (say, its ack was lost) after the decider's cached head.
    await store.append(subject, envelope(subject, TurnRequested(message="req-2"), "req-2"))

    reply = await submit(decider, subject, "req-2")

    assert reply.answer == "already"  # re-decided on the fold, which has it
    assert taken_in(await stored(store, subject)) == ["first", "req-2"]


async def test_an_id_used_on_another_subject_fails_only_its_own_request(
    store: EventStore, subject: str
) -> None:
    elsewhere = log_subject("acme", new_id())
    reused = new_id()
    await store.append(elsewhere, envelope(elsewhere, TurnRequested(message="x"), raw_id=reused))
    decider = Decider(store, Counting().ledger())

    results = await asyncio.gather(
        submit(decider, subject, "reused", raw_id=reused), submit(decider, subject, "fine"),
        return_exceptions=True,
    )  # fmt: skip

    assert isinstance(results[0], IdUsedElsewhere)
    assert "request_id 'reused' was already used" in str(results[0])
    assert isinstance(results[1], Took)
    assert results[1].answer == "taken"
    assert taken_in(await stored(store, subject)) == ["fine"]


async def test_requests_queued_behind_an_append_are_stored_as_one_batch(
    store: EventStore, subject: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    decider = Decider(store, Counting().ledger())
    appends: list[int] = []
    real = store.append_batch

    async def counted(subject: str, envelopes: Any, **kw: Any) -> Any:
        appends.append(len(envelopes))
        return await real(subject, envelopes, **kw)

    monkeypatch.setattr(store, "append_batch", counted)
    requests = [new_id()[:16] for _ in range(LIMIT + 5)]

    replies = await asyncio.gather(*(submit(decider, subject, rid) for rid in requests))

    assert [r.answer for r in replies].count("taken") == LIMIT
    assert sum(appends) == LIMIT
    assert len(appends) < LIMIT  # fewer round trips than requests: they were grouped
    assert max(appends) > 1
    events = await stored(store, subject)
    assert taken_in(events) == requests[:LIMIT]  # in the order they were submitted


async def test_a_snapshot_resumes_the_fold_at_its_position(store: EventStore, subject: str) -> None:
    for i in range(12):
        await store.append(subject, envelope(subject, TurnRequested(message=f"e{i}"), f"e{i}"))
    first = Counting()
    await Decider(store, first.ledger(), snapshot_after=10).current(subject)
    assert len(first.folded) == 12  # no snapshot yet: from the start, then one was saved
    await store.append(subject, envelope(subject, TurnRequested(message="e12"), "e12"))

    second = Counting()
    decider = Decider(store, second.ledger(), snapshot_after=10)
    cached = await decider.current(subject)

    events = await stored(store, subject)
    assert second.folded == [events[-1].seq]  # only the tail after the snapshot
    assert cached.state.taken == [f"e{i}" for i in range(13)]
    assert (cached.head.seq, cached.head.hash) == (events[-1].seq, events[-1].hash)
    assert (await submit(decider, subject, "e3")).answer == "already"  # decides on it


async def test_a_snapshot_of_another_fold_version_is_not_used(
    store: EventStore, subject: str
) -> None:
    for i in range(4):
        await store.append(subject, envelope(subject, TurnRequested(message=f"v{i}"), f"v{i}"))
    await Decider(store, Counting().ledger(), snapshot_after=2).current(subject)

    newer = Counting()
    await Decider(store, newer.ledger(version=2), snapshot_after=2).current(subject)

    assert len(newer.folded) == 4


async def test_an_evicted_fold_is_folded_again_from_the_store(
    store: EventStore, subject: str
) -> None:
    counting = Counting()
    decider = Decider(store, counting.ledger(), capacity=1)
    await submit(decider, subject, "a")
    other_subject = log_subject("acme", new_id())
    await submit(decider, other_subject, "b")  # evicts `subject`
    await store.append(subject, envelope(subject, TurnRequested(message="other"), "other"))
    counting.folded.clear()

    cached = await decider.current(subject)  # not `fresh`: only a miss reads the store

    assert cached.state.taken == ["a", "other"]
    assert len(counting.folded) == 2  # from the start
    kept = await decider.current(other_subject)
    assert kept.state.taken == ["b"]


async def test_a_purged_subject_is_folded_from_the_start(
    store: EventStore, js: JetStreamContext, subject: str
) -> None:
    decider = Decider(store, Counting().ledger())
    await submit(decider, subject, "old")
    await js.purge_stream(streams.SESSIONS.name, subject=subject)
    await store.append(subject, envelope(subject, TurnRequested(message="new"), "new"))

    cached = await decider.current(subject, fresh=True)

    assert cached.state.taken == ["new"]


async def test_types_outside_the_fold_are_skipped_undecoded_yet_move_the_head(
    store: EventStore, subject: str
) -> None:
    counting = Counting()
    only_requests = frozenset({type_of_class(TurnRequested)})
    decider = Decider(store, counting.ledger(types=only_requests))
    await store.append(subject, envelope(subject, SessionRenamed(title="t")))
    await store.append(subject, envelope(subject, TurnRequested(message="r"), "r"))

    reply = await submit(decider, subject, "mine")

    assert reply.answer == "taken"
    cached = await decider.current(subject)
    assert (cached.state.taken, cached.state.renamed) == (["r", "mine"], 0)
    assert len(counting.folded) == 2  # the rename was never decoded or folded


class NotYet(Exception):
    pass


async def test_a_stale_answer_reads_the_tail_before_it_stands(
    store: EventStore, subject: str
) -> None:
    decider = Decider(store, Counting().ledger(), stale=(NotYet,))
    await submit(decider, subject, "first")
    await store.append(subject, envelope(subject, SessionRenamed(title="t")))

    def needs_rename(state: Slots) -> Decision[str]:
        if state.renamed == 0:
            raise NotYet("no rename folded")
        return Decision((TurnRequested(message="after"),), answer="ok")

    def wrap(_: Slots, event: Event) -> Envelope[Event]:
        return envelope(subject, event, "after")

    decision = await decider.submit(subject, needs_rename, wrap)
    assert decision.answer == "ok"

    def never(_: Slots) -> Decision[str]:
        raise NotYet("never there")

    with pytest.raises(NotYet, match="never there"):
        await decider.submit(subject, never, wrap)
    assert taken_in(await stored(store, subject))[-1] == "after"


async def test_a_snapshot_needs_a_state_type(store: EventStore) -> None:
    plain = replace(Counting().ledger(), state_type=None)
    with pytest.raises(ValueError, match="needs a state_type"):
        Decider(store, plain, snapshot_after=3)


async def test_a_fresh_decision_that_stores_nothing_is_made_on_the_head(
    store: EventStore, subject: str
) -> None:
    decider = Decider(store, Counting().ledger())
    await submit(decider, subject, "first")
    await store.append(subject, envelope(subject, TurnRequested(message="late"), "late"))

    def seen(state: Slots) -> Decision[list[str]]:
        return Decision(answer=list(state.taken))  # stores nothing: no append to check it

    def wrap(_: Slots, event: Event) -> Envelope[Event]:
        return envelope(subject, event)

    assert (await decider.submit(subject, seen, wrap)).answer == ["first"]  # the cache
    assert (await decider.submit(subject, seen, wrap, fresh=True)).answer == ["first", "late"]


async def test_a_writer_that_reads_nothing_starts_at_the_head_and_learns_its_positions(
    store: EventStore, subject: str
) -> None:
    for i in range(3):
        await store.append(subject, envelope(subject, TurnRequested(message=f"h{i}"), f"h{i}"))
    counting = Counting()
    decider = Decider(store, counting.ledger(replay=False))

    request = Request("mine", take("mine"), lambda _, event: envelope(subject, event, "mine"))
    decision, placed = await decider.place(subject, request)

    events = await stored(store, subject)
    assert decision.answer == "taken"  # on an empty fold: the history was not read
    assert counting.folded == [events[-1].seq]  # only its own event, once stored
    assert [(p.seq, p.hash) for p in placed] == [(events[-1].seq, events[-1].hash)]
