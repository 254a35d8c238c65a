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

`--compare-with TREE [--runs N]`: the store of another checkout (`mkdir /tmp/base && git
archive REV | tar -x -C /tmp/base`) as the baseline, this tree's as the project. Each round
runs this script's measuring part (`--measure URL`) as a process with one tree's sources first
on its PYTHONPATH, against one shared nats-server, rounds alternating which side goes first:
append p50 (one writer), appends/s (16 writers) and the restore of an `--events` session,
reported as the median and spread of the rounds' project/baseline cost ratios.
"""

import argparse
import asyncio
import json
import os
import subprocess
import sys
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
HERE = Path(__file__).resolve().parents[1]  # this checkout: the project of --compare-with


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


async def measure_figures(url: str, appends: int, events: int, restores: int) -> None:
    """One round of `--compare-with`, in the process of one side: its figures, as JSON."""
    nc = await connect(url)
    js = nc.jetstream()
    store = await open_store(js, streams.SESSIONS)
    session, head = new_id(), EMPTY
    subject, latencies = log_subject("bench", session), []
    for index in range(appends + 50):
        start = time.perf_counter()
        head = (await store.append(subject, envelope(TurnRequested(message="x"), session),
                                   expect=head)).head  # fmt: skip
        if index >= 50:  # warmed up
            latencies.append(time.perf_counter() - start)
    latencies.sort()

    async def writer(per_writer: int) -> None:
        mine = new_id()
        where, at = log_subject("bench", mine), EMPTY
        for _ in range(per_writer):
            at = (await store.append(where, envelope(TurnRequested(message="x"), mine),
                                     expect=at)).head  # fmt: skip

    per_writer = max(50, appends // 16)
    start = time.perf_counter()
    await asyncio.gather(*(writer(per_writer) for _ in range(16)))
    rate = 16 * per_writer / (time.perf_counter() - start)
    seeded = session_filter("bench", await seed_session(store, events))
    loads = []
    for _ in range(restores):
        start = time.perf_counter()
        await store.load(seeded, CountsFold(), use_snapshot=False)
        loads.append(time.perf_counter() - start)
    figures = {
        "append_p50_ms": latencies[len(latencies) // 2] * 1000,
        "appends_per_s": rate,
        "restore_p50_ms": sorted(loads)[len(loads) // 2] * 1000,
    }
    print("FIGURES " + json.dumps(figures), flush=True)
    await nc.close()


async def compare(other: Path, args: argparse.Namespace) -> None:
    from fleet_harness.bench import report_rounds, sides_in_turn, sources_of

    paths = {"baseline": sources_of(other), "project": sources_of(HERE)}
    found: dict[str, list[dict[str, float]]] = {"baseline": [], "project": []}
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(store_dir=Path(tmp) / "store", sync_interval=args.sync).start()
        try:
            nc = await connect(server.url)
            await bootstrap(nc.jetstream())
            await nc.close()
            for _, side in sides_in_turn(args.runs):
                command = [
                    sys.executable, __file__, "--measure", server.url, "--appends",
                    str(args.appends), "--events", str(args.events), "--restores",
                    str(args.restores),
                ]  # fmt: skip
                env = {**os.environ, "PYTHONPATH": paths[side]}
                done = await asyncio.to_thread(
                    subprocess.run, command, env=env, capture_output=True, text=True, check=True
                )
                line = next(x for x in done.stdout.splitlines() if x.startswith("FIGURES "))
                found[side].append(json.loads(line.removeprefix("FIGURES ")))
        finally:
            server.stop()
    print(f"sync_interval {args.sync}; baseline {other}, project {HERE}")
    for key, title, unit, higher in (
        ("append_p50_ms", "append p50, one writer", "ms", False),
        ("appends_per_s", "appends/s, 16 writers", "appends/s", True),
        ("restore_p50_ms", f"restore of a {args.events:,}-event session, p50", "ms", False),
    ):
        report_rounds(
            title, [r[key] for r in found["baseline"]], [r[key] for r in found["project"]],
            unit=unit, higher_is_better=higher,
        )  # fmt: skip


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--appends", type=int, default=2000)
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--restores", type=int, default=9)
    parser.add_argument("--sync", default="always", help="nats-server sync_interval")
    parser.add_argument(
        "--compare-with", type=Path, default=None, metavar="TREE",
        help="another checkout as the baseline (its sources first on PYTHONPATH)",
    )  # fmt: skip
    parser.add_argument("--runs", type=int, default=5, help="interleaved rounds (--compare-with)")
    parser.add_argument("--measure", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        await measure_figures(args.measure, args.appends, args.events, args.restores)
        return
    if args.compare_with is not None:
        await compare(args.compare_with, args)
        return
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
