"""How fast `interrupt` ends a running cell, through the bus (issue 8: a cancelled turn should
stop within a second instead of waiting out the cell's `wall_s`).

Run: .venv/bin/python bench/interrupt.py [--samples N]

Starts its own nats-server and one sandbox-broker. For each kind of cell (a busy loop, a
`time.sleep(60)`), it starts the cell, asks `interrupt` until the broker says a cell was running,
and times from that ask to the cell's own reply; then checks the sandbox kept its variables.
Prints p50/p95 per kind and the ratio to the one-second goal (printed, never asserted).
"""

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nats.aio.client import Client

from fleet_events import bus as verbs
from fleet_events import sandbox as sb
from fleet_events.bus import Ping
from fleet_events.envelope import new_id
from fleet_harness import bench
from fleet_harness.waits import eventually
from fleet_mesh import rpc
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.connection import connect
from fleet_mesh.credentials import env_for
from fleet_mesh.natsserver import NatsServer

TENANT = "t-bench"
CELLS = {"busy loop": "while True:\n    pass", "sleep(60)": "import time\ntime.sleep(60)"}


def start_broker(url: str, root: Path) -> subprocess.Popen[bytes]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "NATS_URL": url,
        **env_for("sandbox-broker"),  # the server's users, where it has them
        "FLEET_REPLICA": "sandbox-broker-bench",
        "FLEET_SANDBOX_ROOT": str(root / "sandboxes"),
        "FLEET_SANDBOX_UID_BASE": "353000",
        "FLEET_LOG_LEVEL": "WARNING",
    }
    if "PYTHONPATH" in os.environ:  # to compare against another checkout's services
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    log = open(root / "broker.log", "ab")  # noqa: SIM115 - lives as long as the broker
    return subprocess.Popen(
        [sys.executable, "-m", "fleet_sandbox_broker"], env=env, stdout=log, stderr=log
    )


async def one(nc: Client, sandbox: str, context: str, code: str) -> float:
    run = sb.Execute(
        request_id=new_id(), tenant=TENANT, sandbox=sandbox, context=context, code=code
    )
    cell = asyncio.create_task(rpc.call_verb(nc, verbs.EXECUTE, run, target=sandbox, timeout=120))

    async def interrupted() -> bool:
        ask = sb.InterruptCell(request_id=new_id(), tenant=TENANT, sandbox=sandbox, context=context)
        reply = await rpc.call_verb(nc, verbs.INTERRUPT_CELL, ask, target=sandbox, timeout=10)
        return reply.interrupted

    start = time.perf_counter()
    while not await interrupted():  # the first asks may land before the cell starts
        await asyncio.sleep(0.01)
        start = time.perf_counter()  # timed from the ask that found the cell running
    reply = await cell
    took = time.perf_counter() - start
    if reply.kind != "error" or "interrupt" not in reply.error.lower():
        raise SystemExit(f"the cell was not interrupted: {reply}")
    return took


async def run(samples: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        server = NatsServer(store_dir=root / "nats").start()
        broker: subprocess.Popen[bytes] | None = None
        try:
            nc = await connect(server.url, name="bench")
            await bootstrap(nc.jetstream())
            broker = start_broker(server.url, root)

            async def answered() -> bool:
                try:
                    await rpc.call_verb(nc, verbs.ping("sandbox-broker"), Ping(), timeout=0.5)
                except Exception:
                    return False
                return True

            await eventually(answered, timeout=60, what="the broker to answer ping")
            create = sb.CreateSandbox(
                request_id=new_id(), tenant=TENANT, limits=sb.Limits(wall_s=600)
            )
            info = await rpc.call_verb(nc, verbs.CREATE_SANDBOX, create, timeout=60)
            context = new_id()
            opened = sb.OpenContext(
                request_id=new_id(), tenant=TENANT, sandbox=info.sandbox, context=context
            )
            await rpc.call_verb(nc, verbs.OPEN_CONTEXT, opened, target=info.sandbox, timeout=30)
            print(f"{samples} interrupts per kind of cell; goal: the cell ends within 1 s")
            for name, code in CELLS.items():
                times = [await one(nc, info.sandbox, context, code) for _ in range(samples)]
                s = bench.stats(times)
                print(
                    f"{name:>10}: interrupt -> reply p50 {s.p50_ms:.1f} ms, p95 "
                    f"{s.p95_ms:.1f} ms; p95 / 1 s = {s.p95_ms / 1000:.3f}"
                )
            await nc.close()
        finally:
            if broker is not None:
                broker.terminate()
                broker.wait(30)
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20)
    asyncio.run(run(parser.parse_args().samples))


if __name__ == "__main__":
    main()
