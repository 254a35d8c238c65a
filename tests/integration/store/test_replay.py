"""Replay determinism: ordered replay == snapshot + tail == the in-memory model."""

import asyncio

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nats.js import JetStreamContext

from fleet_events import Event, new_id, streams
from fleet_events.session import (
    SessionCreated,
    SessionRenamed,
    TurnCompleted,
    TurnFailed,
    TurnRequested,
    log_subject,
    run_subject,
    session_filter,
)
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.connection import connect
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.store import EMPTY, EventStore, Head, StoredEvent, open_store

from .conftest import envelope


class Summary(msgspec.Struct, kw_only=True):
    title: str = ""
    turns: list[str] = msgspec.field(default_factory=list)
    completed: int = 0
    failed: int = 0
    subjects: list[str] = msgspec.field(default_factory=list)


def apply(state: Summary, subject: str, data: Event) -> Summary:
    match data:
        case SessionCreated(title=title) | SessionRenamed(title=title):
            state.title = title
        case TurnRequested(message=message):
            state.turns.append(message)
        case TurnCompleted():
            state.completed += 1
        case TurnFailed():
            state.failed += 1
    state.subjects.append(subject.rsplit(".", 1)[-1])
    return state


class SummaryFold:
    name = "test-summary"
    state_type = Summary

    def __init__(self, version: int = 1) -> None:
        self.version = version

    def initial(self) -> Summary:
        return Summary()

    def evolve(self, state: Summary, event: StoredEvent) -> Summary:
        return apply(state, event.subject, event.envelope.data)


async def append_turns(store: EventStore, subject: str, messages: list[str]) -> Head:
    """Append one TurnRequested per message to `subject`; returns its new head."""
    head = await store.head(subject)
    for message in messages:
        env = envelope(TurnRequested(message=message), subject)
        head = (await store.append(subject, env, expect=head)).head
    return head


events_strategy = st.lists(
    st.tuples(
        st.sampled_from(["log", "run"]),
        st.one_of(
            st.builds(SessionRenamed, title=st.text(max_size=12)),
            st.builds(TurnRequested, message=st.text(max_size=20)),
            st.builds(TurnCompleted, answer=st.text(max_size=8)),
            st.builds(TurnFailed, error=st.just("boom")),
        ),
    ),
    min_size=1,
    max_size=30,
)


async def _scenario(url: str, events: list[tuple[str, Event]], cut: int) -> None:
    nc = await connect(url)
    try:
        await bootstrap(nc.jetstream())
        store = await open_store(nc.jetstream(), streams.SESSIONS)
        session = new_id()
        subjects = {"log": log_subject("acme", session), "run": run_subject("acme", session, "r1")}
        heads: dict[str, Head] = {}
        model = Summary()
        filt = session_filter("acme", session)
        fold = SummaryFold()
        for index, (which, data) in enumerate(events):
            subject = subjects[which]
            env = envelope(data, subject)
            heads[subject] = (
                await store.append(subject, env, expect=heads.get(subject, EMPTY))
            ).head
            model = apply(model, subject, data)
            if index + 1 == cut:
                await store.save_snapshot(
                    filt, fold, await store.load(filt, fold, use_snapshot=False)
                )

        full = await store.load(filt, fold, use_snapshot=False)
        resumed = await store.load(filt, fold)
        assert full.state == model
        assert resumed.state == model
        assert resumed.from_snapshot == (cut <= len(events))
        assert resumed.replayed == len(events) - (cut if cut <= len(events) else 0)
        assert resumed.heads == full.heads == heads
        newer = await store.load(filt, SummaryFold(version=2))
        assert not newer.from_snapshot
        assert newer.replayed == len(events)
        assert newer.state == model
    finally:
        await nc.close()


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(events=events_strategy, cut=st.integers(min_value=1, max_value=35))
def test_replay_snapshot_tail_and_model_agree(
    nats_server: NatsServer, events: list[tuple[str, Event]], cut: int
) -> None:
    asyncio.run(_scenario(nats_server.url, events, cut))


async def test_replay_from_a_sequence_and_of_one_subject(store: EventStore) -> None:
    session = new_id()
    log, run = log_subject("acme", session), run_subject("acme", session, "r1")
    heads = {log: EMPTY, run: EMPTY}
    for i in range(6):
        subject = log if i % 2 == 0 else run
        env = envelope(TurnRequested(message=str(i)), subject)
        heads[subject] = (await store.append(subject, env, expect=heads[subject])).head

    everything = [e async for e in store.replay(session_filter("acme", session))]
    assert [e.envelope.data.message for e in everything] == [str(i) for i in range(6)]
    only_run = [e.envelope.data.message async for e in store.replay(run)]
    assert only_run == ["1", "3", "5"]
    tail = [e.envelope.data.message async for e in store.replay(log, from_seq=everything[3].seq)]
    assert tail == ["4"]
    assert [e async for e in store.replay(log_subject("acme", new_id()))] == []
    last = await store.last(run)
    assert last is not None
    assert last.envelope.data == TurnRequested(message="5")


async def test_live_subscription_sees_the_backlog_then_new_events(store: EventStore) -> None:
    subject = log_subject("acme", new_id())
    await append_turns(store, subject, ["0", "1", "2"])
    seen: list[str] = []
    live = store.subscribe(subject, from_seq=1)

    async def read(n: int) -> None:
        async for event in live:
            seen.append(event.envelope.data.message)
            if len(seen) == n:
                return

    await asyncio.wait_for(read(3), 10)
    await append_turns(store, subject, ["new"])
    await asyncio.wait_for(read(4), 10)
    await live.aclose()
    assert seen == ["0", "1", "2", "new"]


async def test_a_wildcard_snapshot_never_stands_for_a_run_named_like_it(store: EventStore) -> None:
    session = new_id()
    fold = SummaryFold()
    await append_turns(store, run_subject("acme", session, "r2"), ["r2"])
    everything = f"fleet.session.acme.{session}.run.>"
    await store.save_snapshot(everything, fold, await store.load(everything, fold))
    only_all = await store.load(run_subject("acme", session, "_all"), fold)
    assert not only_all.from_snapshot
    assert only_all.state == Summary()


async def test_a_snapshot_the_log_no_longer_reaches_is_ignored(
    store: EventStore, js: JetStreamContext
) -> None:
    subject = log_subject("acme", new_id())
    fold = SummaryFold()
    await append_turns(store, subject, ["0", "1", "2"])
    await store.load(subject, fold, snapshot_after=0)
    assert (await store.load(subject, fold)).from_snapshot
    await js.purge_stream(streams.SESSIONS.name, subject=subject)
    after = await store.load(subject, fold)
    assert not after.from_snapshot
    assert after.state == Summary()


async def test_a_snapshot_that_cannot_be_saved_does_not_fail_the_load(store: EventStore) -> None:
    subject = log_subject("acme", new_id())
    # 60 turns of 200 KB make a state far over the snapshot bucket's value limit
    await append_turns(store, subject, ["x" * 200_000] * 60)
    loaded = await store.load(subject, SummaryFold(), snapshot_after=0)
    assert len(loaded.state.turns) == 60
    assert not (await store.load(subject, SummaryFold())).from_snapshot
