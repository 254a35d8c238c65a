"""`ServiceContext.consume`: a service's durable consumers start with its setup, settle each
message as the handler answers (a retry after a delay included), survive their consumer being
removed on the server, and stop with the service, handing back what they had not handled."""

import asyncio
from collections.abc import AsyncIterator

import pytest
from nats.js import JetStreamContext

from fleet_events import new_id, streams
from fleet_events.streams import ConsumerSpec
from fleet_harness.waits import eventually
from fleet_mesh import service
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.settings import MeshSettings
from fleet_mesh.work import Delivery, Retry, Settle


@pytest.fixture
async def spec(js: JetStreamContext) -> AsyncIterator[ConsumerSpec]:
    kind = f"test-{new_id()[:12]}"
    made = ConsumerSpec(
        streams.WORK.name, kind, f"fleet.work.quality.{kind}", ack_wait_s=30.0, max_deliver=5
    )
    yield made
    await js.delete_consumer(made.stream, made.durable)


async def publish(js: JetStreamContext, spec: ConsumerSpec, body: bytes) -> None:
    await js.publish(spec.filter_subject, body, stream=streams.WORK.name)


async def queued(js: JetStreamContext, spec: ConsumerSpec) -> tuple[int, int]:
    info = await js.consumer_info(spec.stream, spec.durable)
    return int(info.num_pending), int(info.num_ack_pending)


def settings(server: NatsServer) -> MeshSettings:
    return MeshSettings(nats_url=server.url, replica=f"r-{new_id()[:8]}")


async def test_a_consumer_started_in_setup_stops_with_the_service(
    js: JetStreamContext, spec: ConsumerSpec, nats_server: NatsServer
) -> None:
    seen: list[bytes] = []

    async def handler(d: Delivery) -> Settle:
        seen.append(d.data)
        return Settle.ACK

    async def setup(ctx: service.ServiceContext) -> None:
        await ctx.consume(spec, handler)

    async with service.running("quality", setup, settings=settings(nats_server)) as ctx:
        assert len(ctx.consumers) == 1
        await publish(js, spec, b"while up")
        await eventually(lambda: seen == [b"while up"], what="the message handled")
    await publish(js, spec, b"after stop")
    # nobody takes it: the service's consumer stopped with it
    assert await queued(js, spec) == (1, 0)
    assert seen == [b"while up"]


async def test_a_retry_comes_back_after_its_delay_and_is_then_acked(
    js: JetStreamContext, spec: ConsumerSpec, nats_server: NatsServer
) -> None:
    attempts: list[int] = []

    async def handler(d: Delivery) -> Settle | Retry:
        attempts.append(d.attempt)
        return Retry(0.2) if d.attempt < 3 else Settle.ACK

    async def setup(ctx: service.ServiceContext) -> None:
        await ctx.consume(spec, handler)

    async with service.running("quality", setup, settings=settings(nats_server)):
        await publish(js, spec, b"x")
        # far sooner than the 30 s ack deadline: the retries asked for their own delay
        await eventually(lambda: attempts == [1, 2, 3], timeout=10, what="two retries")
        await eventually(lambda: _settled(js, spec), what="the third delivery acked")


async def _settled(js: JetStreamContext, spec: ConsumerSpec) -> bool:
    return await queued(js, spec) == (0, 0)


async def test_a_batch_is_handled_in_order_in_one_slot(
    js: JetStreamContext, spec: ConsumerSpec, nats_server: NatsServer
) -> None:
    seen: list[bytes] = []

    async def handler(d: Delivery) -> Settle:
        seen.append(d.data)
        return Settle.ACK

    for index in range(7):
        await publish(js, spec, str(index).encode())

    async def setup(ctx: service.ServiceContext) -> None:
        await ctx.consume(spec, handler, batch=4, sync_ack=False)

    async with service.running("quality", setup, settings=settings(nats_server)):
        await eventually(lambda: len(seen) == 7, what="all seven handled")
        await eventually(lambda: _settled(js, spec), what="all seven acked")
    assert seen == [str(index).encode() for index in range(7)]


async def test_stopping_mid_batch_hands_back_the_rest_at_once(
    js: JetStreamContext, spec: ConsumerSpec, nats_server: NatsServer
) -> None:
    held = asyncio.Event()
    taken: list[tuple[bytes, int]] = []

    async def holder(d: Delivery) -> Settle:
        held.set()
        await asyncio.Event().wait()  # runs until the service stops
        return Settle.ACK

    async def taker(d: Delivery) -> Settle:
        taken.append((d.data, d.attempt))
        return Settle.ACK

    for index in range(3):
        await publish(js, spec, str(index).encode())

    async def first(ctx: service.ServiceContext) -> None:
        await ctx.consume(spec, holder, batch=3, grace_s=0.1)

    async def second(ctx: service.ServiceContext) -> None:
        await ctx.consume(spec, taker)

    async with service.running("quality", first, settings=settings(nats_server)):
        await asyncio.wait_for(held.wait(), 10)
    async with service.running("quality", second, settings=settings(nats_server)):
        # all three again at once, none waiting out the 30 s ack deadline, the two never
        # handled included
        await eventually(lambda: len(taken) == 3, what="the three handed back")
    assert sorted(taken) == [(b"0", 2), (b"1", 2), (b"2", 2)]


async def test_a_consumer_removed_on_the_server_is_made_again(
    js: JetStreamContext, spec: ConsumerSpec, nats_server: NatsServer
) -> None:
    seen: list[bytes] = []

    async def handler(d: Delivery) -> Settle:
        seen.append(d.data)
        return Settle.ACK

    async def setup(ctx: service.ServiceContext) -> None:
        await ctx.consume(spec, handler, poll_s=0.2)

    async with service.running("quality", setup, settings=settings(nats_server)):
        await publish(js, spec, b"first")
        await eventually(lambda: seen == [b"first"], what="the first handled")
        await js.delete_consumer(spec.stream, spec.durable)
        await publish(js, spec, b"second")  # the new consumer starts from the stream's start
        await eventually(lambda: b"second" in seen, timeout=15, what="the consumer remade")
