"""`list` under load: 2,000 calls against a tenant with a long sandbox log (issue 8).

Run: .venv/bin/python bench/broker_list.py [--calls N] [--live N] [--filler N]
Compare another checkout: PYTHONPATH=<its src dirs> .venv/bin/python bench/broker_list.py

Starts its own nats-server and one sandbox-broker, writes a tenant's log straight to the
SANDBOXES stream (`--live` sandboxes with 2 KiB of labels each, `--filler` context events; no
processes: `list` reads the log, not the sandboxes), then sends `--calls` list requests, 20 at
a time, each with its own request id, while pinging the broker every 50 ms. Prints list and
ping latency, timeouts, the broker's resident memory before and after, and the ratios
(list p50 / ping p50; RSS after / before). Goals, printed, never asserted: no timeouts, ping
p50 under 10x its idle value, RSS growth under 2x.
"""

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from nats.aio.client import Client

from fleet_events import bus as verbs
from fleet_events import sandbox as sb
from fleet_events import streams
from fleet_events.bus import Ping
from fleet_events.codec import Codec
from fleet_events.envelope import Actor, Envelope, new_id, utc_now
from fleet_harness import bench
from fleet_harness.waits import eventually
from fleet_mesh import rpc
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.connection import connect
from fleet_mesh.credentials import env_for
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.store import EventStore

TENANT = "t-bench"


def start_broker(url: str, root: Path) -> subprocess.Popen[bytes]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "NATS_URL": url,
        **env_for("sandbox-broker"),  # the server's users, where it has them
        "FLEET_REPLICA": "sandbox-broker-bench",
        "FLEET_SANDBOX_ROOT": str(root / "sandboxes"),
        "FLEET_SANDBOX_UID_BASE": "352000",
        "FLEET_SANDBOX_POOL_SIZE": "0",
        "FLEET_LOG_LEVEL": "WARNING",
    }
    if "PYTHONPATH" in os.environ:  # to compare against another checkout's services
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    log = open(root / "broker.log", "ab")  # noqa: SIM115 - lives as long as the broker
    return subprocess.Popen(
        [sys.executable, "-m", "fleet_sandbox_broker"], env=env, stdout=log, stderr=log
    )


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def write_log(nc: Client, live: int, filler: int) -> None:
    js = nc.jetstream()
    store = EventStore(js, streams.SANDBOXES, Codec(await JetStreamBlobs.open(js)))
    actor = Actor(service="sandbox-broker", replica="elsewhere")  # never this broker's own
    labels = {"session": "s1", "note": "n" * 2048}
    boxes = [new_id() for _ in range(live)]

    async def put(sandbox: str, event: Any) -> None:
        envelope: Envelope[Any] = Envelope(
            id=new_id(), tenant=TENANT, actor=actor, ts=utc_now(), data=event, session="s1"
        )
        await store.append(sb.sandbox_subject(TENANT, sandbox), envelope)

    for sandbox in boxes:
        await put(sandbox, sb.SandboxCreated(sandbox=sandbox, provider="local",
                  replica="elsewhere", workspace=f"/nowhere/{sandbox}/workspace",
                  labels=labels))  # fmt: skip
    for n in range(filler):
        sandbox = boxes[n % len(boxes)]
        await put(sandbox, sb.ContextOpened(sandbox=sandbox, context=f"c{n}"))


async def ping(nc: Client) -> float:
    start = time.perf_counter()
    await rpc.call_verb(nc, verbs.ping("sandbox-broker"), Ping(), timeout=10)
    return time.perf_counter() - start


async def load(nc: Client, calls: int) -> tuple[list[float], int, list[float]]:
    latencies: list[float] = []
    timeouts = 0
    pings: list[float] = []
    done = asyncio.Event()

    async def pinger() -> None:
        while not done.is_set():
            try:
                pings.append(await ping(nc))
            except Exception:
                pings.append(10.0)
            await asyncio.sleep(0.05)

    async def one() -> None:
        nonlocal timeouts
        request = sb.ListSandboxes(request_id=new_id(), tenant=TENANT)
        start = time.perf_counter()
        try:
            await rpc.call_verb(nc, verbs.LIST_SANDBOXES, request, timeout=5)
        except Exception:
            timeouts += 1
            return
        latencies.append(time.perf_counter() - start)

    task = asyncio.create_task(pinger())
    slots = asyncio.Semaphore(20)

    async def bounded() -> None:
        async with slots:
            await one()

    await asyncio.gather(*(bounded() for _ in range(calls)))
    done.set()
    await task
    return latencies, timeouts, pings


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        server = NatsServer(store_dir=root / "nats").start()
        broker: subprocess.Popen[bytes] | None = None
        try:
            nc = await connect(server.url, name="bench")
            await bootstrap(nc.jetstream())
            await write_log(nc, args.live, args.filler)
            broker = start_broker(server.url, root)

            async def answered() -> bool:
                try:
                    await ping(nc)
                except Exception:
                    return False
                return True

            await eventually(answered, timeout=60, what="the broker to answer ping")
            idle = bench.stats([await ping(nc) for _ in range(50)])
            before = rss_mb(broker.pid)
            latencies, timeouts, pings = await load(nc, args.calls)
            after = rss_mb(broker.pid)
            listed = bench.stats(latencies) if latencies else None
            busy = bench.stats(pings)
            print(f"{args.calls} list calls, {args.live} live sandboxes, "
                  f"{args.live + args.filler} events in the tenant's log")  # fmt: skip
            if listed is not None:
                print(f"list p50 {listed.p50_ms:.1f} ms, p95 {listed.p95_ms:.1f} ms")
            print(f"list timeouts (5 s): {timeouts}  (goal: 0)")
            print(f"ping idle p50 {idle.p50_ms:.2f} ms; under load p50 {busy.p50_ms:.1f} ms, "
                  f"p95 {busy.p95_ms:.1f} ms, ratio {busy.p50_ms / idle.p50_ms:.1f}x "
                  "(goal: < 10x)")  # fmt: skip
            if listed is not None:
                print(f"list p50 / idle ping p50: {listed.p50_ms / idle.p50_ms:.1f}x")
            print(f"broker RSS {before:.0f} MB -> {after:.0f} MB, ratio {after / before:.2f}x "
                  "(goal: < 2x)")  # fmt: skip
            await nc.close()
        finally:
            if broker is not None:
                broker.terminate()
                broker.wait(30)
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--live", type=int, default=500)
    parser.add_argument("--filler", type=int, default=4500)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
