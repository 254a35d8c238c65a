"""Provider-level tests: a real `LocalProvider` (real sandboxes, as processes) with no bus.

Each test module passes its own uid base, so modules never share (and so never sweep) a uid.
"""

import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from fleet_events.sandbox import ExecuteReply, Limits, ToolCall, ToolReply
from fleet_sandbox_broker.providers.local import LocalProvider, LocalSandbox, LocalSettings

LIMITS = Limits(
    memory_mb=512, cpu_s_per_cell=30, cpu_s_total=600, nproc=32, file_mb=64, open_files=128,
    wall_s=30,
)  # fmt: skip


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
