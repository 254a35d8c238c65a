"""`EventStore.watch`: the events of given types stored after a sequence, as they are stored,
each once, with nothing falling between what was read and what is watched."""

import asyncio
from collections.abc import Callable

import pytest
from nats.aio.client import Client
from nats.js.errors import APIError

from fleet_events import new_id
from fleet_events.session import (
    CancelRequested,
    SessionCreated,
    SessionRenamed,
    TurnCompleted,
    log_subject,
    session_filter,
)
from fleet_mesh.store import EventStore, StoredEvent

from .conftest import envelope

WAIT_S = 10.0


async def test_a_watch_hands_out_only_what_is_stored_after_the_sequence_given(
    store: EventStore, fresh_subject: Callable[[], str]
) -> None:
    subject = fresh_subject()
    first = await store.append(subject, envelope(SessionCreated(title="a"), subject))
    second = await store.append(subject, envelope(SessionRenamed(title="b"), subject))
    async with await store.watch(subject, after_seq=first.seq) as watch:
        got = await watch.next(WAIT_S)
        assert got is not None
        assert got.seq == second.seq
        assert isinstance(got.envelope.data, SessionRenamed)
        assert await watch.next(0.05) is None  # nothing else was stored
        third = await store.append(subject, envelope(SessionRenamed(title="c"), subject))
        got = await watch.next(WAIT_S)
        assert got is not None
        assert got.seq == third.seq


async def test_a_watch_from_now_misses_nothing_stored_once_it_returns(
    store: EventStore, fresh_subject: Callable[[], str]
) -> None:
    # the waiter it replaces: an event stored between "subscribe" and "read the tail" is seen
    # by one of them; here what is stored before `watch` is in a read, after it in the watch
    subject = fresh_subject()
    before = await store.append(subject, envelope(SessionCreated(title="old"), subject))
    watch = await store.watch(subject)
    try:
        after = await store.append(subject, envelope(SessionRenamed(title="new"), subject))
        got = await watch.next(WAIT_S)
        assert got is not None
        assert got.seq == after.seq
        assert got.seq > before.seq
        assert await watch.next(0.05) is None  # the event before the watch is not handed out
    finally:
        await watch.close()


async def test_only_the_types_asked_for_are_handed_out(
    store: EventStore, fresh_subject: Callable[[], str]
) -> None:
    subject = fresh_subject()
    watch = await store.watch(subject, (CancelRequested, "turn.completed"), after_seq=0)
    try:
        await store.append(subject, envelope(SessionCreated(), subject))
        cancel = await store.append(subject, envelope(CancelRequested(reason="stop"), subject))
        await store.append(subject, envelope(SessionRenamed(title="x"), subject))
        done = await store.append(subject, envelope(TurnCompleted(answer="42"), subject))
        seen = [await watch.next(WAIT_S), await watch.next(WAIT_S)]
        assert [s.seq for s in seen if s is not None] == [cancel.seq, done.seq]
        assert watch.last_seq == done.seq
    finally:
        await watch.close()


async def test_a_wildcard_watch_sees_every_subject_under_it_in_stream_order(
    store: EventStore,
) -> None:
    session = new_id()
    log = log_subject("acme", session)
    run = f"{log.removesuffix('.log')}.run.{new_id()}"
    async with await store.watch(session_filter("acme", session)) as watch:
        a = await store.append(log, envelope(SessionCreated(), log))
        b = await store.append(run, envelope(SessionRenamed(title="r"), run))
        got = [await watch.next(WAIT_S), await watch.next(WAIT_S)]
        assert [(g.subject, g.seq) for g in got if g is not None] == [(log, a.seq), (run, b.seq)]


async def test_a_callback_watch_is_called_in_order_and_stops_when_closed(
    store: EventStore, fresh_subject: Callable[[], str]
) -> None:
    subject = fresh_subject()
    seen: list[int] = []
    three = asyncio.Event()

    async def on_event(stored: StoredEvent) -> None:
        seen.append(stored.seq)
        if len(seen) == 3:
            three.set()

    watch = await store.watch(subject, cb=on_event, after_seq=0)
    appended = [
        (await store.append(subject, envelope(SessionRenamed(title=str(i)), subject))).seq
        for i in range(3)
    ]
    await asyncio.wait_for(three.wait(), WAIT_S)
    assert seen == appended
    await watch.close()
    await store.append(subject, envelope(SessionRenamed(title="late"), subject))
    # a later event on another watch arrives; the closed one saw nothing more
    async with await store.watch(subject, after_seq=appended[-1]) as probe:
        assert await probe.next(WAIT_S) is not None
    assert seen == appended


async def test_a_publish_the_stream_refused_is_never_handed_out(
    store: EventStore, nc: Client, fresh_subject: Callable[[], str]
) -> None:
    # core NATS delivers a message the stream refused (a stale `expect`, a fenced holder) to
    # core subscribers all the same: the old waiters had to re-read the stream to be sure
    subject = fresh_subject()
    created = await store.append(subject, envelope(SessionCreated(), subject))
    async with await store.watch(subject, after_seq=created.seq) as watch:
        stale = {"Nats-Expected-Last-Subject-Sequence": "0", "Fleet-Type": "turn.completed"}
        with pytest.raises(APIError):  # wrong last sequence
            await nc.jetstream().publish(subject, b"{}", headers=stale)
        stored = await store.append(subject, envelope(TurnCompleted(answer="ok"), subject))
        got = await watch.next(WAIT_S)
        assert got is not None
        assert got.seq == stored.seq


async def test_a_negative_sequence_is_refused(
    store: EventStore, fresh_subject: Callable[[], str]
) -> None:
    with pytest.raises(ValueError, match="after_seq must be 0 or more"):
        await store.watch(fresh_subject(), after_seq=-1)
    with pytest.raises(ValueError, match="no event type"):
        await store.watch(fresh_subject(), ())
