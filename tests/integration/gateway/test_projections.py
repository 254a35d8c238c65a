"""The read models are a deterministic fold of the log: rebuilt from sequence 0 they are the
live ones byte for byte, a batch delivered twice changes nothing, and a restarted replica goes
on from its checkpoint instead of replaying the stream."""

import asyncio
from pathlib import Path

from nats.aio.client import Client
from nats.js import JetStreamContext
from tests.integration.gateway.api_kit import Api, running_api, tenant_id

from fleet_events import Actor, Envelope, new_id, streams, utc_now
from fleet_events.codec import Codec
from fleet_events.run import LlmCalled
from fleet_events.session import (
    CoreMemoryChanged,
    SessionCreated,
    SessionRenamed,
    TurnCompleted,
    TurnFailed,
    TurnStarted,
    log_subject,
    run_subject,
)
from fleet_gateway.projections import Folded, ProjectionStore, Projector
from fleet_gateway.projections.projector import SESSIONS_FILTER
from fleet_harness.waits import eventually
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.connection import connect
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.store import EMPTY, EventStore, open_store

AGENT = Actor(service="agent", replica="test")


async def _agent(
    store: EventStore, tenant: str, session: str, data: object, turn: str, run: str | None = None
) -> int:
    subject = run_subject(tenant, session, run) if run else log_subject(tenant, session)
    env = Envelope(
        id=new_id(), tenant=tenant, session=session, turn=turn, run=run, actor=AGENT,
        ts=utc_now(), data=data,
    )  # fmt: skip
    return (await store.append(subject, env)).seq


async def _history(api: Api, store: EventStore, tenant: str) -> int:
    """A little of everything the read models fold; returns the last sequence written."""
    for title in ("alpha", "beta"):
        made = await api.call("POST", "/api/v1/sessions", tenant, json={"title": title})
        session = made.json()["session"]["id"]
        for i, end in enumerate((TurnCompleted(answer="yes"), TurnFailed(error="boom"))):
            asked = await api.call(
                "POST", f"/api/v1/sessions/{session}/turns", tenant, json={"message": f"q{i}"}
            )
            turn = asked.json()["turn"]
            await _agent(store, tenant, session, TurnStarted(replica="agent-0"), turn)
            await _agent(
                store, tenant, session,
                LlmCalled(role="root", model="m", prompt_tokens=10 + i, completion_tokens=2,
                          latency_ms=1.5, cost=0.001),
                turn, run=f"r{i}",
            )  # fmt: skip
            await _agent(
                store, tenant, session,
                CoreMemoryChanged(block="scratchpad", op="append", value=f"n{i}"), turn,
            )  # fmt: skip
            await _agent(store, tenant, session, end, turn)
        renamed = await api.call(
            "PATCH", f"/api/v1/sessions/{session}", tenant, json={"title": title.upper()}
        )
        assert renamed.status_code == 200
    deleted = await api.call("DELETE", f"/api/v1/sessions/{session}", tenant)
    return int(deleted.json()["seq"])


async def _codec(js: JetStreamContext) -> Codec:
    return Codec(await JetStreamBlobs.open(js))


async def test_a_rebuild_from_sequence_0_equals_the_live_read_models_byte_for_byte(
    nats_server: NatsServer, nc: Client, js: JetStreamContext, tmp_path: Path
) -> None:
    store = await open_store(js, streams.SESSIONS)
    async with running_api(nats_server.url, tmp_path / "live") as api:
        tenant = tenant_id()
        last = await _history(api, store, tenant)
        live = api.state.projections
        assert live is not None
        rebuilt = ProjectionStore(tmp_path / "rebuilt.sqlite")
        await Projector(nc, store, await _codec(js), rebuilt).catch_up()
        assert rebuilt.checkpoint >= last
        assert await live.wait_for(rebuilt.checkpoint, 10)
        assert live.checkpoint == rebuilt.checkpoint  # nothing else writes during the test
        mine = live.dump(tenant)
        assert mine.count(b'"sessions"') == 2
        assert mine.count(b'"turns"') == 4
        assert rebuilt.dump(tenant) == mine
        assert rebuilt.dump() == live.dump()
        rebuilt.close()


async def test_a_batch_delivered_again_changes_nothing(
    nats_server: NatsServer, nc: Client, js: JetStreamContext, tmp_path: Path
) -> None:
    store = await open_store(js, streams.SESSIONS)
    codec = await _codec(js)
    async with running_api(nats_server.url, tmp_path / "live") as api:
        tenant = tenant_id()
        await _history(api, store, tenant)
        folded = ProjectionStore(tmp_path / "twice.sqlite")
        projector = Projector(nc, store, codec, folded)
        batch = []
        async for raw in store.read_raw(SESSIONS_FILTER, from_seq=1):
            envelope = await projector._decode(raw)
            batch.append(Folded(raw.subject, raw.seq, envelope))
        half = batch[: len(batch) // 2]
        assert await folded.apply_batch(half) > 0
        assert await folded.apply_batch(batch) > 0
        once = folded.dump()
        checkpoint = folded.checkpoint
        assert await folded.apply_batch(batch) == 0  # the whole stream again
        assert await folded.apply_batch(half) == 0  # an older batch, late
        assert folded.dump() == once
        assert folded.checkpoint == checkpoint
        folded.close()


async def test_a_restarted_replica_goes_on_from_its_checkpoint(
    nats_server: NatsServer, nc: Client, js: JetStreamContext, tmp_path: Path
) -> None:
    store = await open_store(js, streams.SESSIONS)
    data_dir = tmp_path / "gw"
    tenant = tenant_id()
    async with running_api(nats_server.url, data_dir, replica="gateway-r") as api:
        last = await _history(api, store, tenant)
        assert api.state.projections is not None
        assert await api.state.projections.wait_for(last, 10)
        before = api.state.projections.dump(tenant)
    path = data_dir / "projections-gateway-r.sqlite"
    reopened = ProjectionStore(path)
    assert reopened.checkpoint >= last  # the checkpoint survived with the rows it covers
    projector = Projector(nc, store, await _codec(js), reopened)
    assert await projector.catch_up() == 0  # nothing replayed: no event after the checkpoint
    made = await store.append(
        log_subject(tenant, "s-after"),
        Envelope(
            id=new_id(), tenant=tenant, session="s-after", actor=AGENT, ts=utc_now(),
            data=TurnStarted(replica="x"),
        ),
    )  # fmt: skip
    assert await projector.catch_up() == 1
    assert reopened.checkpoint == made.seq
    reopened.close()
    async with running_api(nats_server.url, data_dir, replica="gateway-r") as again:
        assert again.state.projections is not None
        assert again.state.projections.checkpoint == made.seq  # started from the file
        listed = await again.call("GET", "/api/v1/sessions", tenant, params={"status": "all"})
        assert {s["title"] for s in listed.json()["items"]} == {"ALPHA", "BETA", ""}
        assert again.state.projections.dump(tenant).startswith(before[:20])


async def test_a_busy_log_costs_the_running_projector_no_doorbell_message_per_event(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    """Every message a subscription receives is parsed by nats-py, headers and all: a
    doorbell subscribed all the time received every event a second time (it was a third of
    the projector's cost at 1,000 events/s). It is one-shot now, rung only when a read found
    nothing, so events that keep coming are read once each."""
    own = await connect(nats_server.url, name="projector-under-test")
    store = await open_store(own.jetstream(), streams.SESSIONS)  # its reads count too
    models = ProjectionStore(None)
    projector = Projector(own, store, await _codec(js), models)
    running = asyncio.create_task(projector.run())
    try:
        tenant, batches, per_batch = tenant_id(), 6, 50
        stored = (await js.stream_info(streams.SESSIONS.name)).state.last_seq
        await eventually(lambda: models.checkpoint >= stored, what="earlier tests' events")
        before = own.stats["in_msgs"]
        last = 0
        for _ in range(batches):
            session = new_id()
            events = [
                Envelope(
                    id=new_id(), tenant=tenant, session=session, actor=AGENT, ts=utc_now(),
                    data=SessionCreated(title="busy") if i == 0 else SessionRenamed(title=f"{i}"),
                )
                for i in range(per_batch)
            ]  # fmt: skip
            done = await store.append_batch(log_subject(tenant, session), events, expect=EMPTY)
            last = done[-1].seq
        await eventually(lambda: models.checkpoint >= last, what="the projector to fold all")
        received = own.stats["in_msgs"] - before
        # each event read once, plus per batch at most one doorbell and a few end-of-batch
        # statuses; a doorbell on every event would be at least twice the events
        assert received < batches * per_batch + batches * 10, received
        assert models.session(tenant, session) is not None
    finally:
        projector.stop()
        await asyncio.wait_for(running, 10)
        models.close()
        await own.close()
