"""The daytona provider's own overhead per call, on the contract FAKE (issue 14's benchmark).

Baseline: the SDK alone against the fake (`run_code` in a context; `fork`). Project: the same
through `DaytonaProvider` (the cell helper's call, its framed answer taken out of the output,
the fd capture, retries and the circuit; for fork, the child's labels). The difference is the
provider's cost above Daytona's own latency; a real Daytona adds its network round trips to
both sides. Goal (issue 14): <= 2 ms above the fake. The same through the broker and the bus:
the provider column of `bench/sandbox.py`; fork per step: `bench/broker_fork_profile.py`.

    .venv/bin/python bench/daytona_provider.py [samples]
"""

import asyncio
import sys
import tempfile
from pathlib import Path

from daytona import CreateSandboxFromSnapshotParams

from fleet_events.sandbox import Limits, ToolCall, ToolReply
from fleet_harness.bench import report, side_by_side
from fleet_harness.daytona_fake import DaytonaFake
from fleet_sandbox_broker.providers.daytona.provider import DaytonaProvider, DaytonaSettings


async def _no_tools(call: ToolCall) -> ToolReply:
    return ToolReply(ok=False, error="none")


async def main(samples: int) -> None:
    with tempfile.TemporaryDirectory() as state:
        fake = await DaytonaFake(Path(state)).start()
        provider = DaytonaProvider(
            DaytonaSettings(
                api_key="k", api_url=fake.url, target="fake", replica="bench", snapshot="fleet-vm"
            )
        )
        try:
            box = await provider.create("bench-1", Limits())
            await box.open_context("main")
            raw = await provider.client.create(
                CreateSandboxFromSnapshotParams(snapshot="fleet-vm"), timeout=30
            )
            raw_ctx = await raw.code_interpreter.create_context()

            async def sdk_exec() -> object:
                return await raw.code_interpreter.run_code("6*7", context=raw_ctx)

            async def provider_exec() -> object:
                return await box.execute(
                    context="main",
                    code="6*7",
                    variables={},
                    blobs={},
                    tools=[],
                    output_fields=None,
                    wall_s=30,
                    relay=_no_tools,
                )

            base, mine = await side_by_side(sdk_exec, provider_exec, samples=samples, warmup=10)
            report(
                "warm exec 6*7: SDK run_code vs DaytonaProvider.execute (fake)",
                base,
                mine,
                goal="<= 2 ms above the SDK alone",
            )
            print(f"   provider overhead p50 {mine.p50_ms - base.p50_ms:.2f} ms", flush=True)

            forks: list[object] = []

            async def sdk_fork() -> object:
                child = await raw.fork()
                forks.append(child)
                return child

            async def provider_fork() -> object:
                child = await provider.fork(box, f"bench-c{len(forks)}")
                forks.append(child)
                return child

            n = max(10, samples // 10)
            base, mine = await side_by_side(sdk_fork, provider_fork, samples=n, warmup=2, block=5)
            report(
                "fork: SDK fork vs DaytonaProvider.fork (fake)",
                base,
                mine,
                goal="<= 2 ms above the SDK alone",
            )
            print(f"   provider overhead p50 {mine.p50_ms - base.p50_ms:.2f} ms", flush=True)
        finally:
            await provider.close()
            await fake.close()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 200))
