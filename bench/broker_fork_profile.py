"""Where a fork through the broker spends its time, per step, on each provider.

The broker is built in this process (`fleet_sandbox_broker.app.setup`, the code the service
runs) with both providers, Daytona on the contract FAKE (also in this process, so its own
work, such as copying the sandbox's files for a fork, shows inside the provider's calls), and
each step of `Broker.fork_box` is timed by wrapping it. The caller asks over NATS, as the agent
does. A profile, not a comparison: it prints where the time goes, to read beside the provider
column of `bench/sandbox.py`.

    .venv/bin/python bench/broker_fork_profile.py [samples]
"""

import asyncio
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from fleet_events import bus
from fleet_events import sandbox as sb
from fleet_events.envelope import new_id
from fleet_harness.daytona_fake import DaytonaFake
from fleet_mesh import rpc
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.connection import connect
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.runtime_config import RuntimeConfig
from fleet_mesh.service import ServiceContext
from fleet_sandbox_broker import app
from fleet_sandbox_broker.config import BrokerSettings

TIMES: dict[str, list[float]] = {}


def timed(owner: Any, name: str, label: str) -> None:
    """Replace `owner.name` (a coroutine function) by one that records how long each call took."""
    inner: Callable[..., Awaitable[Any]] = getattr(owner, name)

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return await inner(*args, **kwargs)
        finally:
            TIMES.setdefault(label, []).append((time.perf_counter() - start) * 1000)

    setattr(owner, name, wrapper)


async def main(samples: int) -> None:
    with tempfile.TemporaryDirectory(prefix="fleet-fork-profile-") as tmp:
        root = Path(tmp)
        server = NatsServer(store_dir=root / "nats").start()
        fake = await DaytonaFake(root / "fake").start()
        nc = await connect(server.url, name="fork-profile")
        broker_nc = await connect(server.url, name="fork-profile-broker")
        ctx = ServiceContext(
            name="sandbox-broker", replica="fork-profile", nc=broker_nc,
            js=broker_nc.jetstream(), log=logging.getLogger("fork-profile"),
        )  # fmt: skip
        try:
            await bootstrap(nc.jetstream())
            settings = BrokerSettings(
                root=root / "sandboxes", volumes=root / "volumes", pool_size=0,
                uid_base=356000, uid_count=16, daytona_api_key=SecretStr("bench-key"),
                daytona_api_url=fake.url, daytona_target="fake", daytona_snapshot="fleet-vm",
            )  # fmt: skip
            broker = await app.setup(ctx, settings)
            for name, provider in broker.providers.items():
                timed(provider, "fork", f"{name}: provider.fork")
            daytona = broker.providers["daytona"]
            timed(daytona, "call", "daytona:   each Daytona call in it (fork, labels)")
            timed(broker, "reserve", "broker: reserve (the quota's view caught up)")
            timed(broker, "adopt", "broker: adopt (serve the child's verbs)")
            timed(broker, "append", "broker: append sandbox.forked (JetStream ack)")
            timed(broker, "counted", "broker: counted (the view folds it)")
            timed(broker, "fork_box", "broker: fork_box in all")
            config = await RuntimeConfig.open(nc.jetstream())
            for chosen in ("local", "daytona"):
                tenant = f"tp-{chosen}"
                await config.set("sandbox_provider", chosen, tenant=tenant)
                create = sb.CreateSandbox(request_id=new_id(), tenant=tenant)
                parent = await rpc.call_verb(nc, bus.CREATE_SANDBOX, create, timeout=60)
                TIMES.clear()
                calls = []
                for _ in range(samples):
                    ask = sb.ForkSandbox(request_id=new_id(), tenant=tenant, sandbox=parent.sandbox)
                    start = time.perf_counter()
                    await rpc.call_verb(
                        nc, bus.FORK_SANDBOX, ask, target=parent.sandbox, timeout=60
                    )
                    calls.append((time.perf_counter() - start) * 1000)
                print(f"== fork on {chosen}: request/reply p50 {statistics.median(calls):.2f} ms "
                      f"over {samples}", flush=True)  # fmt: skip
                for label, found in TIMES.items():
                    print(f"   {label:52} n={len(found):3}  p50 {statistics.median(found):7.2f} ms")
        finally:
            for stop in reversed(ctx.on_stop):
                await stop()
            await broker_nc.close()
            await nc.close()
            await fake.close()
            server.stop()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 40))
