"""The session fold through the real event store: replay, snapshot + tail, offloaded payloads,
and a log a newer replica wrote to (a real nats-server, JetStream object store and KV)."""

import msgspec
import pytest
from nats.js import JetStreamContext

from fleet_agent.lenient import LenientCodec
from fleet_events import Actor, BlobRef, Envelope, Event, new_id, streams, utc_now
from fleet_events.codec import CodecError
from fleet_events.run import ChatMessage, LlmCalled, RunStarted
from fleet_events.session import (
    DocumentLoaded,
    DocumentRef,
    SessionImage,
    SessionImported,
    TurnCompleted,
    TurnRequested,
    log_subject,
    run_subject,
    session_filter,
)
from fleet_events.session_fold import FOLD, append_core_memory, history
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.store import EMPTY, EventStore, Head, open_store

ACTOR = Actor(service="agent", replica="a-new")


class ToolBudgetSet(Event, frozen=True, kw_only=True, tag="future.tool_budget_set"):
    """Written by a newer replica; this version has no such type."""

    tools: int


class Session:
    def __init__(self, store: EventStore) -> None:
        self.store = store
        self.id = new_id()
        self.heads: dict[str, Head] = {}

    async def append(self, data: Event, *, turn: str | None = None, run: str | None = None) -> None:
        subject = run_subject("acme", self.id, run) if run else log_subject("acme", self.id)
        env = Envelope(
            id=new_id(), tenant="acme", session=self.id, turn=turn, run=run, actor=ACTOR,
            ts=utc_now(), data=data,
        )  # fmt: skip
        appended = await self.store.append(subject, env, expect=self.heads.get(subject, EMPTY))
        self.heads[subject] = appended.head

    @property
    def filter(self) -> str:
        return session_filter("acme", self.id)


async def lenient_store(js: JetStreamContext) -> EventStore:
    blobs = await JetStreamBlobs.open(js)
    snapshots = await js.key_value(streams.SNAPSHOTS.bucket)
    return EventStore(js, streams.SESSIONS, LenientCodec(blobs), snapshots=snapshots)


async def test_replay_and_snapshot_plus_tail_give_the_same_session(js: JetStreamContext) -> None:
    session = Session(await open_store(js, streams.SESSIONS))
    await session.append(TurnRequested(message="summarise the log"), turn="t1")
    await session.append(RunStarted(kind="rlm", tree="t1"), turn="t1", run="r1")
    prompt = [ChatMessage(role="user", content="x" * 300_000)]  # over the inline limit
    await session.append(
        LlmCalled(role="planner", model="m", messages=prompt, response="ok"), turn="t1", run="r1"
    )
    await session.append(TurnCompleted(answer="done"), turn="t1")
    reader = await lenient_store(js)
    first = await reader.load(session.filter, FOLD, snapshot_after=0)
    assert history(first.state) == [{"question": "summarise the log", "answer": "done"}]
    assert first.replayed == 4

    changed = append_core_memory(first.state.image.core_memory, "human", "prefers tables")
    await session.append(changed, turn="t2")
    doc = DocumentRef(
        alias="log",
        source="upload",
        origin="app.log",
        blob=BlobRef(object="acme/ab", sha256="ab", size=2),
    )
    await session.append(DocumentLoaded(document=doc), turn="t2")
    resumed = await reader.load(session.filter, FOLD)
    full = await reader.load(session.filter, FOLD, use_snapshot=False)
    assert resumed.from_snapshot
    assert resumed.replayed == 2
    assert resumed.state == full.state
    assert resumed.heads == full.heads == session.heads
    assert full.state.image.core_memory.human == "prefers tables"
    assert full.state.image.active_document == "log"

    await session.append(SessionImported(image=SessionImage(), source_head_hash="0" * 64))
    after = await reader.load(session.filter, FOLD)
    # the import replaces everything the session was, but not the fold's own bookkeeping:
    # the log still holds turn t1's request, and a retry of it is still that request
    assert after.state == msgspec.structs.replace(FOLD.initial(), requests=full.state.requests)
    assert list(after.state.requests) == list(full.state.requests) != []


async def test_a_log_a_newer_replica_wrote_to_still_loads(js: JetStreamContext) -> None:
    session = Session(await open_store(js, streams.SESSIONS))
    await session.append(TurnRequested(message="hi"), turn="t1")
    await session.append(ToolBudgetSet(tools=2), turn="t1")
    await session.append(TurnCompleted(answer="hello"), turn="t1")

    strict = await open_store(js, streams.SESSIONS)
    with pytest.raises(CodecError, match=r"future\.tool_budget_set"):
        await strict.load(session.filter, FOLD, use_snapshot=False)

    loaded = await (await lenient_store(js)).load(session.filter, FOLD, use_snapshot=False)
    assert history(loaded.state) == [{"question": "hi", "answer": "hello"}]
    assert (loaded.state.skipped, loaded.state.skipped_count) == (("future.tool_budget_set",), 1)
    assert loaded.replayed == 3
