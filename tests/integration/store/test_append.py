"""Appends: optimistic concurrency, dedup with the lost-ack read-back, atomic batches."""

import asyncio
from collections.abc import Callable

import msgspec
import pytest
from nats.js import JetStreamContext

from fleet_events import BlobRef, new_id, streams
from fleet_events.envelope import Offloaded
from fleet_events.session import (
    SessionCreated,
    TurnRequested,
    log_subject,
    run_subject,
    session_filter,
)
from fleet_mesh.store import (
    EMPTY,
    AppendConflict,
    DuplicateElsewhere,
    DuplicateInBatch,
    EventStore,
    Head,
    StoreError,
    WrongSubject,
)

from .conftest import envelope


async def test_twenty_concurrent_appends_at_one_sequence_exactly_one_wins(
    store: EventStore, fresh_subject: Callable[[], str]
) -> None:
    subject = fresh_subject()
    first = await store.append(
        subject, envelope(SessionCreated(title="race"), subject), expect=EMPTY
    )
    racers = [envelope(TurnRequested(message=f"writer {i}"), subject) for i in range(20)]

    results = await asyncio.gather(
        *(store.append(subject, e, expect=first.head) for e in racers), return_exceptions=True
    )

    winners = [r for r in results if not isinstance(r, BaseException)]
    conflicts = [r for r in results if isinstance(r, AppendConflict)]
    assert len(winners) == 1
    assert len(conflicts) == 19
    events = [e async for e in store.replay(subject)]
    assert len(events) == 2
    assert events[1].prev_hash == first.hash  # the chain did not fork
    assert events[1].envelope.id in {e.id for e in racers}


async def test_the_same_event_id_is_stored_once(
    store: EventStore, fresh_subject: Callable[[], str]
) -> None:
    subject = fresh_subject()
    event = envelope(SessionCreated(title="once"), subject)
    first = await store.append(subject, event, expect=EMPTY)
    again = await store.append(subject, event)  # expect = current head: passes the seq check

    assert again.duplicate
    assert again.seq == first.seq
    assert [e.envelope.id async for e in store.replay(subject)] == [event.id]


async def test_a_retry_after_a_lost_ack_is_recognised_by_read_back_not_a_conflict(
    store: EventStore, fresh_subject: Callable[[], str]
) -> None:
    subject = fresh_subject()
    event = envelope(SessionCreated(title="lost ack"), subject)
    stored = await store.append(subject, event, expect=EMPTY)
    # The writer never saw that ack, so it retries with the head it had before: the server
    # answers "wrong last sequence" (sequence check runs before dedup).
    retried = await store.append(subject, event, expect=EMPTY)

    assert retried.duplicate
    assert (retried.seq, retried.hash) == (stored.seq, stored.hash)
    other = envelope(SessionCreated(title="someone else"), subject)
    with pytest.raises(AppendConflict, match="expected last sequence 0"):
        await store.append(subject, other, expect=EMPTY)
    assert len([e async for e in store.replay(subject)]) == 1


async def test_a_conflicting_batch_stores_nothing(
    store: EventStore, fresh_subject: Callable[[], str]
) -> None:
    subject = fresh_subject()
    head = (await store.append(subject, envelope(SessionCreated(), subject), expect=EMPTY)).head
    await store.append(
        subject, envelope(TurnRequested(message="moves the head"), subject), expect=head
    )

    batch = [envelope(TurnRequested(message=f"b{i}"), subject) for i in range(5)]
    with pytest.raises(AppendConflict):
        await store.append_batch(subject, batch, expect=head)

    stored = [e.envelope.id async for e in store.replay(subject)]
    assert len(stored) == 2
    assert not {e.id for e in batch} & set(stored)


async def test_a_committed_batch_is_contiguous_despite_concurrent_writers(
    store: EventStore, fresh_subject: Callable[[], str]
) -> None:
    subject, noise = fresh_subject(), fresh_subject()
    batch = [envelope(TurnRequested(message=f"b{i}"), subject) for i in range(8)]

    async def chatter() -> None:
        head = EMPTY
        for i in range(30):
            head = (
                await store.append(
                    noise, envelope(TurnRequested(message=str(i)), noise), expect=head
                )
            ).head

    appended, _ = await asyncio.gather(store.append_batch(subject, batch, expect=EMPTY), chatter())

    seqs = [a.seq for a in appended]
    assert seqs == list(range(seqs[0], seqs[0] + len(batch)))
    replayed = [e async for e in store.replay(subject)]
    assert [e.envelope.id for e in replayed] == [e.id for e in batch]
    assert [e.seq for e in replayed] == seqs
    assert (await store.head(subject)) == Head(seqs[-1], appended[-1].hash)
    assert (await store.verify(subject)).ok


async def test_a_retried_batch_after_a_lost_ack_is_a_duplicate(
    store: EventStore, fresh_subject: Callable[[], str]
) -> None:
    subject = fresh_subject()
    batch = [envelope(TurnRequested(message=f"b{i}"), subject) for i in range(3)]
    first = await store.append_batch(subject, batch, expect=EMPTY)
    again = await store.append_batch(subject, batch, expect=EMPTY)
    assert all(a.duplicate for a in again)
    assert [a.seq for a in again] == [a.seq for a in first]
    assert len([e async for e in store.replay(subject)]) == 3


async def test_a_batch_whose_last_event_alone_was_stored_by_another_writer_is_a_conflict(
    store: EventStore, fresh_subject: Callable[[], str]
) -> None:
    subject = fresh_subject()
    batch = [envelope(TurnRequested(message=f"b{i}"), subject) for i in range(3)]
    # another replica stored only the retried last request
    await store.append(subject, batch[-1], expect=EMPTY)
    with pytest.raises(AppendConflict) as caught:
        await store.append_batch(subject, batch, expect=EMPTY)
    assert caught.value.actual == (await store.head(subject)).seq
    assert [e.envelope.id async for e in store.replay(subject)] == [batch[-1].id]


async def test_an_event_id_already_used_on_another_subject_is_refused(store: EventStore) -> None:
    session = new_id()
    # a run's event belongs on its run and on its session's log: the one place it could go twice
    first, second = run_subject("acme", session, "r1"), log_subject("acme", session)
    event = envelope(SessionCreated(title="one id, one place"), first)
    await store.append(first, event, expect=EMPTY)
    with pytest.raises(DuplicateElsewhere, match=f"already stored at sequence .* on {first}"):
        await store.append(second, event, expect=EMPTY)
    assert [e async for e in store.replay(second)] == []


async def test_tail_reads_what_came_after_a_sequence(
    store: EventStore, fresh_subject: Callable[[], str]
) -> None:
    subject = fresh_subject()
    head = EMPTY
    seqs = []
    for i in range(5):
        head = (
            await store.append(
                subject, envelope(TurnRequested(message=str(i)), subject), expect=head
            )
        ).head
        seqs.append(head.seq)
    tail = [e.envelope.data.message async for e in store.tail(subject, after_seq=seqs[2])]
    assert tail == ["3", "4"]
    assert [e async for e in store.tail(subject, after_seq=seqs[-1])] == []


async def test_a_lost_ack_retry_is_recognised_even_after_another_writer_appended(
    store: EventStore, fresh_subject: Callable[[], str]
) -> None:
    subject = fresh_subject()
    start = (await store.append(subject, envelope(SessionCreated(), subject), expect=EMPTY)).head
    mine = envelope(TurnRequested(message="mine"), subject)
    stored = await store.append(subject, mine, expect=start)
    await store.append(
        subject, envelope(TurnRequested(message="theirs"), subject), expect=stored.head
    )

    retried = await store.append(subject, mine, expect=start)  # the ack was lost: same call
    assert retried.duplicate
    assert (retried.seq, retried.hash) == (stored.seq, stored.hash)

    batch = [envelope(TurnRequested(message=f"b{i}"), subject) for i in range(3)]
    head = await store.head(subject)
    first = await store.append_batch(subject, batch, expect=head)
    await store.append(
        subject, envelope(TurnRequested(message="after"), subject), expect=first[-1].head
    )
    again = await store.append_batch(subject, batch, expect=head)
    assert [(a.seq, a.hash, a.duplicate) for a in again] == [(a.seq, a.hash, True) for a in first]


async def test_a_batch_reusing_a_stored_id_on_an_unmoved_subject_says_so(
    store: EventStore, fresh_subject: Callable[[], str]
) -> None:
    subject = fresh_subject()
    old = envelope(TurnRequested(message="old"), subject)
    head = (await store.append(subject, old, expect=EMPTY)).head
    with pytest.raises(DuplicateInBatch) as caught:
        await store.append_batch(
            subject, [envelope(TurnRequested(message="new"), subject), old], expect=head
        )
    assert caught.value.actual == head.seq  # reloading would not help: the subject did not move
    assert len([e async for e in store.replay(subject)]) == 1


async def test_an_event_must_belong_to_the_subject_it_is_appended_to(store: EventStore) -> None:
    session = new_id()
    subject, run = log_subject("acme", session), run_subject("acme", session, "r1")
    with pytest.raises(WrongSubject, match=r"names tenant 'other' but .* is 'acme'"):
        await store.append(subject, envelope(SessionCreated(), subject, tenant="other"))
    wrong_session = msgspec.structs.replace(
        envelope(SessionCreated(), subject), session="elsewhere"
    )
    with pytest.raises(WrongSubject, match="names session 'elsewhere'"):
        await store.append(subject, wrong_session, expect=EMPTY)
    wrong_run = msgspec.structs.replace(envelope(SessionCreated(), run), run="r9")
    with pytest.raises(WrongSubject, match="names run 'r9'"):
        await store.append(run, wrong_run, expect=EMPTY)
    stub = Offloaded(blob=BlobRef(object="acme/" + "0" * 64, sha256="0" * 64, size=1), of_type="x")
    with pytest.raises(WrongSubject, match="only the codec writes those"):
        await store.append(subject, envelope(stub, subject), expect=EMPTY)
    assert [e async for e in store.replay(subject)] == []
    assert (await store.append(subject, envelope(SessionCreated(), subject), expect=EMPTY)).seq > 0


async def test_an_event_naming_no_session_is_refused_on_every_session_subject(
    store: EventStore,
) -> None:
    """The attack: an event with no session was taken by any session's log, so a writer of one
    session could put events into (or an insider move them to) another's."""
    session = new_id()
    victim, run = log_subject("acme", session), run_subject("acme", session, "r1")
    nameless = envelope(TurnRequested(message="injected"), "fleet.budget.none")
    with pytest.raises(WrongSubject, match=f"names no session but {victim} belongs to session"):
        await store.append(victim, nameless, expect=EMPTY)
    with pytest.raises(WrongSubject, match="names no session"):
        await store.append_batch(victim, [envelope(SessionCreated(), victim), nameless])
    no_run = msgspec.structs.replace(nameless, session=session)
    with pytest.raises(WrongSubject, match=f"names no run but {run} is run 'r1'"):
        await store.append(run, no_run, expect=EMPTY)
    assert [e async for e in store.replay(session_filter("acme", session))] == []


async def test_a_session_subject_with_extra_tokens_is_refused(store: EventStore) -> None:
    """The attack: `….run.<run>.extra` skipped the run check, so any run's events went there."""
    session = new_id()
    extra = run_subject("acme", session, "r1") + ".extra"
    foreign_run = envelope(TurnRequested(message="x"), run_subject("acme", session, "r2"))
    with pytest.raises(WrongSubject, match=r"cannot be stored on .*\.extra: a session subject is"):
        await store.append(extra, foreign_run, expect=EMPTY)
    assert [e async for e in store.replay(session_filter("acme", session))] == []


async def test_a_message_written_around_the_store_cannot_be_chained_after(
    store: EventStore, js: JetStreamContext, fresh_subject: Callable[[], str]
) -> None:
    subject = fresh_subject()
    await js.publish(subject, b"{}", stream=streams.SESSIONS.name)
    with pytest.raises(StoreError, match="has no Fleet-Hash header"):
        await store.head(subject)
