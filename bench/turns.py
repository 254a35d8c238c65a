"""Turn latency: `TurnRequested` stored → `TurnStarted` stored, through the dispatcher and a turn
worker, with the agent as a real process (the echo runner) and its own nats-server.

Run: `.venv/bin/python bench/turns.py [--samples N] [--sync always|2m]`. Each sample is a new
session: the gateway stand-in appends the request through the event store and the clock stops
when the `TurnStarted` message reaches a core subscription on the log subjects (it is stored by
then: the stream delivers it to subscribers as it stores it). Samples run one at a time, each
after the previous turn ended, so the figure is the path's latency, not queueing.
"""

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from nats.aio.msg import Msg

from fleet_events import Actor, Envelope, bus, new_id, streams, utc_now
from fleet_events.bus import Ping
from fleet_events.chain import TYPE_HEADER
from fleet_events.session import TurnRequested, log_subject
from fleet_harness.procs import Launcher
from fleet_mesh import rpc
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.connection import connect
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.store import open_store

GATEWAY = Actor(service="gateway", replica="bench")
TENANT = "bench"


def percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


async def measure(url: str, samples: int, warmup: int, one_session: bool) -> list[float]:
    nc = await connect(url, name="bench-turns")
    js = nc.jetstream()
    store = await open_store(js, streams.SESSIONS)
    waiting: dict[tuple[str, str], asyncio.Future[float]] = {}

    async def on_log(msg: Msg) -> None:
        kind = (msg.headers or {}).get(TYPE_HEADER, "")
        session = msg.subject.split(".")[3]
        future = waiting.get((session, kind))
        if future is not None and not future.done():
            future.set_result(time.perf_counter())

    await nc.subscribe(f"fleet.session.{TENANT}.*.log", cb=on_log)
    deadline = time.monotonic() + 60
    while True:
        try:
            await rpc.call_verb(nc, bus.ping("agent"), Ping(), timeout=0.5)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
    latencies = []
    loop = asyncio.get_running_loop()
    for i in range(warmup + samples):
        session = "long" if one_session else f"s{i}-{new_id()[:8]}"
        started = waiting[(session, "turn.started")] = loop.create_future()
        ended = waiting[(session, "turn.completed")] = loop.create_future()
        envelope = Envelope(
            id=new_id(), tenant=TENANT, session=session, turn=new_id(), actor=GATEWAY,
            ts=utc_now(), data=TurnRequested(message="ping"),
        )  # fmt: skip
        await store.append(log_subject(TENANT, session), envelope)
        stored = time.perf_counter()
        at = await asyncio.wait_for(started, 30)
        await asyncio.wait_for(ended, 30)
        if i >= warmup:
            latencies.append(at - stored)
    await nc.close()
    return latencies


async def main(samples: int, warmup: int, sync: str, one_session: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(store_dir=Path(tmp) / "store", sync_interval=sync).start()
        launcher = Launcher(nats_url=server.url, log_dir=Path(tmp))
        try:
            nc = await connect(server.url, name="bench-bootstrap")
            await bootstrap(nc.jetstream(), env={})
            await nc.close()
            launcher.start("agent", 1, env={"FLEET_AGENT_RUNNER": "echo"})
            latencies = sorted(await measure(server.url, samples, warmup, one_session))
        finally:
            launcher.stop_all()
            server.stop()
    where = " one after another in one session" if one_session else ", one session each"
    p50, p99 = percentile(latencies, 0.5) * 1000, percentile(latencies, 0.99) * 1000
    print(
        f"== TurnRequested stored -> TurnStarted stored, 1 agent replica, sync_interval {sync}, "
        f"{len(latencies)} turns{where}\n"
        f"   p50 {p50:.2f} ms  p99 {p99:.2f} ms  mean "
        f"{statistics.fmean(latencies) * 1000:.2f} ms   goal: p50 <= 20 ms",
        flush=True,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--sync", default="always", choices=("always", "2m"))
    parser.add_argument(
        "--one-session", action="store_true",
        help="every turn in the same session, so its log grows by a turn each sample",
    )  # fmt: skip
    args = parser.parse_args()
    asyncio.run(main(args.samples, args.warmup, args.sync, args.one_session))
