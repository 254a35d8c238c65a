"""A durable consumer resumes with no acknowledged event lost across a SIGKILLed server."""

import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from fleet_events import new_id, streams
from fleet_events.session import TurnRequested, log_subject, tenant_filter
from fleet_harness.waits import eventually
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.connection import connect
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.store import EMPTY, open_store

from .conftest import envelope


@pytest.mark.slow
async def test_durable_consumer_resumes_after_server_sigkill(private_nats: NatsServer) -> None:
    assert private_nats.sync_interval == "always"
    nc = await connect(private_nats.url)
    js = nc.jetstream()
    await bootstrap(js)
    store = await open_store(js, streams.SESSIONS)
    subject = log_subject("durable", new_id())
    head = EMPTY
    appended: list[str] = []
    for i in range(40):
        event = envelope(TurnRequested(message=f"m{i}"), subject, tenant="durable")
        head = (await store.append(subject, event, expect=head)).head
        appended.append(event.id)

    consumer = "projector"
    await js.add_consumer(
        streams.SESSIONS.name,
        ConsumerConfig(
            durable_name=consumer,
            filter_subject=tenant_filter("durable"),
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=1,
        ),
    )
    sub = await js.pull_subscribe_bind(consumer, stream=streams.SESSIONS.name)
    processed: list[str] = []
    for msg in await sub.fetch(15, timeout=5):
        processed.append(msg.headers["Nats-Msg-Id"] if msg.headers else "")
        await msg.ack_sync()
    await nc.close()

    private_nats.kill()
    private_nats.start()

    nc = await connect(private_nats.url)
    js = nc.jetstream()
    store = await open_store(js, streams.SESSIONS)
    assert [e.envelope.id async for e in store.replay(subject)] == appended
    assert (await store.verify(subject)).ok
    sub = await js.pull_subscribe_bind(consumer, stream=streams.SESSIONS.name)
    before_kill = list(processed)

    async def drained() -> bool:
        try:
            for msg in await sub.fetch(10, timeout=0.5):
                processed.append(msg.headers["Nats-Msg-Id"] if msg.headers else "")
                await msg.ack_sync()
        except TimeoutError:
            pass
        info = await js.consumer_info(streams.SESSIONS.name, consumer)
        return (info.num_pending, info.num_ack_pending) == (0, 0)

    await eventually(drained, timeout=30, what="the consumer to drain after the restart")
    # Nothing lost, in order. The consumer's ack floor is written lazily (it is not fsynced per
    # ack even with sync_interval: always), so a few acked messages may come again: delivery is
    # at-least-once and consumers are idempotent by event id.
    assert list(dict.fromkeys(processed)) == appended
    after_kill = processed[len(before_kill) :]
    assert len(after_kill) == len(set(after_kill))
    assert set(after_kill) >= set(appended) - set(before_kill)
    await nc.close()
