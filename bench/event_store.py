"""Event store benchmark: the project's API beside raw nats-py, in one process, one server.

    .venv/bin/python bench/event_store.py [--appends 2000] [--events 10000]

1. Append: `EventStore.append` (encode, chain hash, optimistic concurrency, dedup id) vs raw
   `js.publish` of pre-encoded bytes with the same headers. Goal: throughput >= 0.75x.
2. Signed vs unsigned: `EventStore.append` with a service's Ed25519 key beside the same store
   with none (one writer, then 16 concurrent). Goal: signed throughput >= 0.9x unsigned.
3. Verify of a signed 10,000-event session against the pinned key set: on the server
   (`EventStore.verify`) and offline from its export (`verify_export`). Goal: <= 2 s.
4. Restore of a 10,000-event session (ordered replay + decode + fold) vs a raw ordered read of
   the same messages with no decoding (the store's batched direct gets, the fastest raw read we
   have; an ordered push consumer's raw read is printed for reference). Goal: <= 2x.
"""

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy

from fleet_events import Actor, Envelope, Event, new_id, streams, utc_now
from fleet_events.catalog import type_of
from fleet_events.chain import HASH_HEADER, PREV_HEADER, TYPE_HEADER, link
from fleet_events.codec import Codec
from fleet_events.session import (
    TurnCompleted,
    TurnRequested,
    log_subject,
    run_subject,
    session_filter,
)
from fleet_events.signing import KeySet, Signer
from fleet_harness.bench import report, side_by_side
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.connection import connect
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.store import EMPTY, EventStore, Head, StoredEvent, open_store, verify_export

ACTOR = Actor(service="bench", replica="b-0")


def envelope(data: Event, session: str, run: str | None = None) -> Envelope[Event]:
    return Envelope(
        id=new_id(), tenant="bench", session=session, run=run, actor=ACTOR, ts=utc_now(), data=data
    )


class Counts(msgspec.Struct):
    requested: int = 0
    completed: int = 0
    chars: int = 0


class CountsFold:
    name = "bench-counts"
    version = 1
    state_type = Counts

    def initial(self) -> Counts:
        return Counts()

    def evolve(self, state: Counts, event: StoredEvent) -> Counts:
        data = event.envelope.data
        if isinstance(data, TurnRequested):
            state.requested += 1
            state.chars += len(data.message)
        elif isinstance(data, TurnCompleted):
            state.completed += 1
        return state


async def bench_append(js: JetStreamContext, store: EventStore, samples: int) -> None:
    session_a, session_b = new_id(), new_id()
    ours, raw = log_subject("bench", session_a), log_subject("bench", session_b)
    head = EMPTY
    raw_seq = 0
    codec = Codec()
    template = envelope(TurnRequested(message="hello " * 20), session_b)
    payload = codec.encode_inline(template)
    digest = link(EMPTY.hash, payload)

    async def project() -> None:
        nonlocal head
        event = envelope(TurnRequested(message="hello " * 20), session_a)
        head = (await store.append(ours, event, expect=head)).head

    async def baseline() -> None:
        nonlocal raw_seq
        headers = {
            "Nats-Msg-Id": new_id(),
            "Nats-Expected-Last-Subject-Sequence": str(raw_seq),
            PREV_HEADER: EMPTY.hash,
            HASH_HEADER: digest,
            TYPE_HEADER: type_of(template.data),
        }
        ack = await js.publish(raw, payload, stream=streams.SESSIONS.name, headers=headers)
        raw_seq = ack.seq

    base, proj = await side_by_side(baseline, project, samples=samples, warmup=50)
    report(
        "append, one writer (latency; throughput = 1/mean)",
        base,
        proj,
        goal="throughput >= 0.75x raw (ratio of p50 <= 1.33x)",
        unit="append",
    )
    print(f"   throughput ratio project/raw = {base.mean_ms / proj.mean_ms:.2f}x")

    # 16 concurrent writers, one subject each: throughput under pipelining
    writers, per_writer = 16, max(50, samples // 16)

    async def run_project() -> float:
        async def writer() -> None:
            session = new_id()
            subject, h = log_subject("bench", session), EMPTY
            for _ in range(per_writer):
                event = envelope(TurnRequested(message="x"), session)
                h = (await store.append(subject, event, expect=h)).head

        start = time.perf_counter()
        await asyncio.gather(*(writer() for _ in range(writers)))
        return writers * per_writer / (time.perf_counter() - start)

    async def run_raw() -> float:
        async def writer() -> None:
            subject, seq = log_subject("bench", new_id()), 0
            for _ in range(per_writer):
                headers = {
                    "Nats-Msg-Id": new_id(),
                    "Nats-Expected-Last-Subject-Sequence": str(seq),
                    PREV_HEADER: EMPTY.hash,
                    HASH_HEADER: digest,
                    TYPE_HEADER: "turn.requested",
                }
                seq = (
                    await js.publish(
                        subject, payload, stream=streams.SESSIONS.name, headers=headers
                    )
                ).seq

        start = time.perf_counter()
        await asyncio.gather(*(writer() for _ in range(writers)))
        return writers * per_writer / (time.perf_counter() - start)

    raw_rates, our_rates = [], []
    for _ in range(3):
        raw_rates.append(await run_raw())
        our_rates.append(await run_project())
    raw_rate, our_rate = max(raw_rates), max(our_rates)
    print(
        f"== append, {writers} concurrent writers\n   raw {raw_rate:,.0f}/s   project "
        f"{our_rate:,.0f}/s   ratio {our_rate / raw_rate:.2f}x   goal: >= 0.75x"
    )


async def bench_signing(js: JetStreamContext, samples: int, events: int) -> None:
    key = Signer.generate("bench")
    keys = KeySet.of([key])
    unsigned = await open_store(js, streams.SESSIONS, signer=None)
    signed = await open_store(js, streams.SESSIONS, signer=key)
    heads = {"unsigned": EMPTY, "signed": EMPTY}
    subjects = {name: log_subject("bench", new_id()) for name in heads}

    def appender(name: str, store: EventStore) -> Callable[[], Awaitable[None]]:
        subject = subjects[name]
        session = subject.split(".")[3]

        async def one() -> None:
            event = envelope(TurnRequested(message="hello " * 20), session)
            heads[name] = (await store.append(subject, event, expect=heads[name])).head

        return one

    base, proj = await side_by_side(
        appender("unsigned", unsigned), appender("signed", signed), samples=samples, warmup=50
    )
    report(
        "append signed vs unsigned, one writer (latency; throughput = 1/mean)",
        base,
        proj,
        goal="signed throughput >= 0.9x unsigned",
        unit="append",
    )
    print(f"   throughput ratio signed/unsigned = {base.mean_ms / proj.mean_ms:.2f}x")
    sign_us = _per_call_us(lambda: key.sign_append("fleet.session.b.s.log", "a" * 64))
    sig = key.sign_append("fleet.session.b.s.log", "a" * 64)
    check_us = _per_call_us(
        lambda: keys.append_problem("fleet.session.b.s.log", "a" * 64, key.key_id, sig)
    )
    print(f"   cost per append: sign {sign_us:.1f} us, verify {check_us:.1f} us")

    writers, per_writer = 16, max(50, samples // 16)

    async def rate(store: EventStore) -> float:
        async def writer() -> None:
            session = new_id()
            subject, h = log_subject("bench", session), EMPTY
            for _ in range(per_writer):
                event = envelope(TurnRequested(message="x"), session)
                h = (await store.append(subject, event, expect=h)).head

        start = time.perf_counter()
        await asyncio.gather(*(writer() for _ in range(writers)))
        return writers * per_writer / (time.perf_counter() - start)

    plain, signed_rates = [], []
    for _ in range(3):
        plain.append(await rate(unsigned))
        signed_rates.append(await rate(signed))
    p, q = max(plain), max(signed_rates)
    print(
        f"== append signed vs unsigned, {writers} concurrent writers\n   unsigned {p:,.0f}/s   "
        f"signed {q:,.0f}/s   ratio {q / p:.2f}x   goal: >= 0.9x"
    )

    session = await seed_session(signed, events)
    filt = session_filter("bench", session)
    start = time.perf_counter()
    online = await signed.verify(filt, keys=keys)
    online_s = time.perf_counter() - start
    lines = [line async for line in signed.export(filt, keys=keys)]
    start = time.perf_counter()
    offline = verify_export(lines, keys=keys)
    offline_s = time.perf_counter() - start
    assert online.ok, online
    assert offline.ok, offline
    assert offline.checked == events
    print(
        f"== verify of a signed {events:,}-event session against pinned keys\n"
        f"   on the server {online_s:.2f} s   offline from its export {offline_s:.2f} s   "
        "goal: <= 2 s"
    )


def _per_call_us(call: Callable[[], object], n: int = 2000) -> float:
    start = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - start) / n * 1e6


async def seed_session(store: EventStore, events: int) -> str:
    session = new_id()
    log, run = log_subject("bench", session), run_subject("bench", session, "root")
    heads: dict[str, Head] = {log: EMPTY, run: EMPTY}
    batch: list[tuple[str, Envelope[Event]]] = []
    for i in range(events):
        subject = log if i % 5 == 0 else run
        data: Event = (
            TurnRequested(message=f"step {i} " * 8) if i % 2 else TurnCompleted(answer="ok")
        )
        batch.append((subject, envelope(data, session, None if subject == log else "root")))
    for subject in (log, run):
        mine = [e for s, e in batch if s == subject]
        for start in range(0, len(mine), 500):
            appended = await store.append_batch(
                subject, mine[start : start + 500], expect=heads[subject]
            )
            heads[subject] = appended[-1].head
    return session


async def bench_restore(js: JetStreamContext, store: EventStore, events: int, samples: int) -> None:
    session = await seed_session(store, events)
    filt = session_filter("bench", session)
    fold = CountsFold()

    async def project() -> None:
        loaded = await store.load(filt, fold, use_snapshot=False)
        assert loaded.replayed == events

    async def baseline() -> None:
        count = 0
        async for _ in store.read_raw(filt):  # the same batched direct gets, no decoding
            count += 1
        assert count == events

    async def consumer_read() -> None:
        last = await js.get_last_msg(streams.SESSIONS.name, filt, direct=True)
        sub = await js.subscribe(
            filt,
            stream=streams.SESSIONS.name,
            ordered_consumer=True,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=1),
            idle_heartbeat=5.0,
        )
        count = 0
        while True:
            msg = await sub.next_msg(timeout=30)
            count += 1
            if msg.metadata.sequence.stream >= (last.seq or 0):
                break
        await sub.unsubscribe()
        assert count == events

    base, proj = await side_by_side(baseline, project, samples=samples, warmup=1, block=1)
    report(
        f"restore of a {events:,}-event session (replay + decode + fold)",
        base,
        proj,
        goal="<= 2x the raw ordered read",
        unit="restore",
    )
    ordered, _ = await side_by_side(consumer_read, project, samples=3, warmup=0, block=1)
    print(
        "   (for reference: a raw read through an ordered push consumer, "
        f"p50 {ordered.p50_ms:.1f} ms)"
    )
    loaded = await store.load(filt, fold, use_snapshot=False)
    await store.save_snapshot(filt, fold, loaded)
    start = time.perf_counter()
    again = await store.load(filt, fold)
    print(
        f"   from snapshot + empty tail: {(time.perf_counter() - start) * 1000:.2f} ms "
        f"(from_snapshot={again.from_snapshot})"
    )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--appends", type=int, default=2000)
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--restores", type=int, default=9)
    parser.add_argument("--sync", default="always", help="nats-server sync_interval")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(store_dir=Path(tmp) / "store", sync_interval=args.sync).start()
        try:
            nc = await connect(server.url)
            js = nc.jetstream()
            await bootstrap(js)
            store = await open_store(js, streams.SESSIONS)
            print(
                f"nats-server {nc.connected_server_version} (sync_interval {server.sync_interval})"
            )
            await bench_append(js, store, args.appends)
            await bench_signing(js, args.appends, args.events)
            await bench_restore(js, store, args.events, args.restores)
            await nc.close()
        finally:
            server.stop()


if __name__ == "__main__":
    asyncio.run(main())
