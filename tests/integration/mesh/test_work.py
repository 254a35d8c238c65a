"""`fleet_mesh.work` on a real work queue, with plain handlers: a message is settled exactly as
its handler says, a handler that raises gets its message back after the ack deadline (not in a
tight loop), and a replica that stops mid-handler hands the message straight to another."""

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest
from nats.js import JetStreamContext

from fleet_events import new_id, streams
from fleet_events.streams import ConsumerSpec
from fleet_harness.waits import eventually
from fleet_mesh.work import Delivery, Handler, Settle, WorkConsumer

LOG = logging.getLogger("test.work")


@pytest.fixture
async def spec(js: JetStreamContext) -> AsyncIterator[ConsumerSpec]:
    """A consumer and subject of this test's own on the shared server's WORK stream."""
    kind = f"test-{new_id()[:12]}"
    made = ConsumerSpec(
        streams.WORK.name, kind, f"fleet.work.quality.{kind}", ack_wait_s=1.0, max_deliver=5
    )
    yield made
    await js.delete_consumer(made.stream, made.durable)


async def publish(js: JetStreamContext, spec: ConsumerSpec, body: bytes) -> None:
    await js.publish(spec.filter_subject, body, stream=streams.WORK.name)


async def queued(js: JetStreamContext, spec: ConsumerSpec) -> int:
    info = await js.consumer_info(spec.stream, spec.durable)
    return int(info.num_pending + info.num_ack_pending)


async def test_ack_and_term_both_take_the_message_off_the_queue(
    js: JetStreamContext, spec: ConsumerSpec
) -> None:
    seen: list[bytes] = []

    async def handler(d: Delivery) -> Settle:
        seen.append(d.data)
        return Settle.TERM if d.data == b"never-again" else Settle.ACK

    consumer = WorkConsumer(js, spec, handler, slots=2, log=LOG)
    await consumer.start()
    try:
        await publish(js, spec, b"done")
        await publish(js, spec, b"never-again")
        await eventually(lambda: consumer.stats.handled == 2, what="both handled")
        await eventually(lambda: _empty(js, spec), what="the queue to be empty")
        assert sorted(seen) == [b"done", b"never-again"]
        info = await js.consumer_info(spec.stream, spec.durable)
        assert info.num_redelivered == 0
    finally:
        await consumer.stop()


async def _empty(js: JetStreamContext, spec: ConsumerSpec) -> bool:
    return await queued(js, spec) == 0


async def test_a_handler_that_raises_gets_its_message_back_after_the_deadline(
    js: JetStreamContext, spec: ConsumerSpec
) -> None:
    attempts: list[int] = []

    async def handler(d: Delivery) -> Settle:
        attempts.append(d.attempt)
        if d.attempt == 1:
            raise RuntimeError("a bug in the handler")
        return Settle.ACK

    consumer = WorkConsumer(js, spec, handler, slots=1, log=LOG)
    await consumer.start()
    try:
        await publish(js, spec, b"x")
        await eventually(lambda: attempts == [1, 2], timeout=10, what="one redelivery")
        assert consumer.stats.failed == 1
        await eventually(lambda: _empty(js, spec), what="the redelivery to be acked")
    finally:
        await consumer.stop()


async def test_leave_touches_nothing_so_the_message_comes_back_to_the_next_holder(
    js: JetStreamContext, spec: ConsumerSpec
) -> None:
    attempts: list[int] = []

    async def handler(d: Delivery) -> Settle:
        attempts.append(d.attempt)
        return Settle.LEAVE if d.attempt == 1 else Settle.ACK

    consumer = WorkConsumer(js, spec, handler, slots=1, log=LOG)
    await consumer.start()
    try:
        await publish(js, spec, b"x")
        await eventually(lambda: attempts == [1, 2], timeout=10, what="redelivery after a leave")
    finally:
        await consumer.stop()


async def test_a_replica_stopping_mid_handler_hands_its_message_to_another_at_once(
    js: JetStreamContext, spec: ConsumerSpec
) -> None:
    long_spec = ConsumerSpec(
        spec.stream, spec.durable, spec.filter_subject, ack_wait_s=60.0, max_deliver=5
    )
    held = asyncio.Event()
    taken: list[tuple[str, int]] = []

    def handler_for(name: str) -> Handler:
        async def handler(d: Delivery) -> Settle:
            taken.append((name, d.attempt))
            if name == "first":
                held.set()
                await asyncio.Event().wait()  # runs until its replica stops
            return Settle.ACK

        return handler

    first = WorkConsumer(js, long_spec, handler_for("first"), slots=1, log=LOG)
    await first.start()
    await publish(js, spec, b"x")
    await asyncio.wait_for(held.wait(), 10)
    second = WorkConsumer(js, long_spec, handler_for("second"), slots=1, log=LOG)
    await second.start()
    try:
        await first.stop(grace_s=0.1)
        # far sooner than the 60 s deadline: the stopping replica gave it back
        await eventually(lambda: ("second", 2) in taken, timeout=10, what="the hand-over")
    finally:
        await second.stop()
