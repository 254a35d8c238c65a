"""The provider contract. Capabilities are declared, so the isolation policy can be honest
about what a provider does (a Daytona fork copies files, not REPL memory)."""

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from fleet_events.sandbox import Capabilities, ExecuteReply, Limits, ToolCall, ToolReply

ToolRelay = Callable[[ToolCall], Awaitable[ToolReply]]


class Sandbox(Protocol):
    id: str
    workspace: Path
    limits: Limits

    @property
    def running(self) -> bool: ...

    @property
    def stopped_reason(self) -> str | None: ...

    async def open_context(self, context: str) -> None: ...

    async def close_context(self, context: str) -> None: ...

    async def execute(
        self,
        *,
        context: str,
        code: str,
        variables: dict[str, str],
        blobs: dict[str, str],
        tools: list[str],
        output_fields: list[dict[str, Any]] | None,
        wall_s: float,
        relay: ToolRelay,
    ) -> ExecuteReply: ...

    async def write_file(self, path: str, data: bytes) -> None: ...

    async def read_file(self, path: str, max_bytes: int) -> bytes: ...

    async def stop(self, reason: str) -> None: ...

    async def destroy(self) -> None: ...


class Provider(Protocol):
    name: str
    capabilities: Capabilities

    async def create(self, sandbox_id: str, limits: Limits, *, fork_ready: bool = True) -> Sandbox:
        """`fork_ready`: keep a checkpoint after every cell so a fork taken mid-cell still
        gets the last completed cell (costs a process fork per cell)."""
        ...

    async def fork(self, parent: Sandbox, child_id: str) -> Sandbox: ...

    async def close(self) -> None: ...
