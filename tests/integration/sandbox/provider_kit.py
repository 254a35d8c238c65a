"""Provider-level tests: a real `LocalProvider` (real sandboxes, as processes) with no bus.

Each test module takes its own block of uids (`uid_block`), so modules never share (and so
never sweep) a uid, not even when two test runs share the host: a claim sweeps the uid's
processes, and each test's provider keeps its uid locks in its own directory.
"""

import contextlib
import fcntl
import os
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from fleet_agent.sandbox_bus import SandboxBus
from fleet_events.sandbox import ExecuteReply, Limits, ToolCall, ToolReply
from fleet_harness.daytona_fake import DaytonaFake
from fleet_harness.procs import Replica
from fleet_mesh.runtime_config import RuntimeConfig
from fleet_sandbox_broker.providers.local import LocalProvider, LocalSandbox, LocalSettings

LIMITS = Limits(
    memory_mb=512, cpu_s_per_cell=30, cpu_s_total=600, nproc=32, file_mb=64, open_files=128,
    wall_s=30,
)  # fmt: skip


BLOCKS = Path("/run/fleet-rlm/test-uid-blocks")
BLOCK_STEP = 10_000
_held: list[int] = []


def uid_block(preferred: int) -> int:
    """The first of `preferred`, `preferred + 10000`, ... that no other process on this host
    holds; held (a flock) for as long as this process lives."""
    BLOCKS.mkdir(parents=True, exist_ok=True)
    for k in range(32):
        base = preferred + k * BLOCK_STEP
        fd = os.open(BLOCKS / f"{base}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        _held.append(fd)
        return base
    raise RuntimeError(f"no free block of test uids from {preferred}: 32 test runs at once?")


def settings(tmp: Path, uid_base: int, **overrides: Any) -> LocalSettings:
    base = LocalSettings(
        root=tmp / "root", uid_base=uid_base, uid_count=8, uid_locks=tmp / "uid-locks"
    )
    return replace(base, **overrides)


@contextlib.asynccontextmanager
async def provider(tmp: Path, uid_base: int, **overrides: Any) -> AsyncIterator[LocalProvider]:
    made = LocalProvider(settings(tmp, uid_base, **overrides))
    try:
        yield made
    finally:
        await made.close()


async def no_tools(call: ToolCall) -> ToolReply:
    return ToolReply(ok=False, error=f"no host tool {call.name!r} in this test")


async def run(
    box: LocalSandbox,
    code: str,
    *,
    context: str = "main",
    tools: list[str] | None = None,
    relay: Any = no_tools,
    wall_s: float = 30,
) -> ExecuteReply:
    if context not in box.contexts:
        await box.open_context(context)
    return await box.execute(
        context=context, code=code, variables={}, blobs={}, tools=tools or [],
        output_fields=None, wall_s=wall_s, relay=relay,
    )  # fmt: skip


def value(reply: ExecuteReply) -> Any:
    assert reply.kind == "result", reply
    return reply.value


def volume_file(
    broker: Replica, fake: DaytonaFake, provider: str, tenant: str, volume: str, path: str
) -> Path:
    """Where a file a sandbox wrote at `volume/<path>` of a durable volume is kept: the
    broker's host directory (local), or the fake's Daytona volume (`fleet.<tenant>.<volume>`;
    a clean child's `.children/<child>` lives in the volume `<that>.children`)."""
    head, _, rest = path.partition("/")
    if provider == "local":
        volumes = Path(broker.env["FLEET_SANDBOX_VOLUMES"]) / tenant
        if head == ".children":
            return volumes / ".children" / volume / rest
        return volumes / volume / path
    if head == ".children":
        return fake.volume_dir(f"fleet.{tenant}.{volume}.children") / rest
    return fake.volume_dir(f"fleet.{tenant}.{volume}") / path


PROVIDERS = ("local", "daytona")


def set_provider(bus: SandboxBus, provider: str) -> None:
    """The tenant's `sandbox_provider` in the config KV: its next create runs there."""

    async def put() -> None:
        config = await RuntimeConfig.open(bus.nc.jetstream())
        await config.set("sandbox_provider", provider, tenant=bus.tenant)

    bus.run(put(), timeout=10)
