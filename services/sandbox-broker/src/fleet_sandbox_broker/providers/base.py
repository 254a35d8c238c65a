"""The provider contract the broker is written against.

Capabilities are declared, so the isolation policy can be honest about what a provider does
(a Daytona fork copies files, not REPL memory). `local` implements this today; a provider that
lacks a verb (say, fork) still implements it and fails with `ForkFailed`, and declares
`fork=False` so the policy never asks.
"""

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from fleet_events.sandbox import Capabilities, ExecuteReply, Limits, ToolCall, ToolReply

ToolRelay = Callable[[ToolCall], Awaitable[ToolReply]]
OutputSink = Callable[[str], Awaitable[None]]
"""Handed what a running cell printed since the last call (a preview of its output)."""


class Sandbox(Protocol):
    """One started sandbox: a process (or VM) holding named REPL contexts and a workspace."""

    id: str
    workspace: Path
    limits: Limits
    contexts: set[str]
    # awaited with the sandbox once it has stopped, for whatever reason
    on_stop: list[Callable[[Any], Awaitable[None]]]
    on_full: list[Callable[[Any, str, str], Awaitable[None]]]
    """Told (sandbox, "bytes" or "inodes", detail) when its disk quota fills; it runs on."""

    @property
    def uid(self) -> int | None: ...

    @property
    def pid(self) -> int | None: ...

    @property
    def running(self) -> bool: ...

    @property
    def stopped_reason(self) -> str | None: ...

    @property
    def stopped_limit(self) -> str | None:
        """`wall_time`, `cpu_time`, `memory`, `inodes`, `frame_size`, `protocol` or `exited`."""
        ...

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

    async def interrupt(self, context: str) -> bool:
        """Stop the cell running in `context` (its reply: an error saying it was interrupted);
        the sandbox and its state survive. False if no cell was running there."""
        ...

    async def write_file(self, path: str, data: bytes) -> None: ...

    async def read_file(self, path: str, max_bytes: int) -> bytes: ...

    async def bind_tenant(self, tenant: str) -> None:
        """Count the sandbox's tasks against its tenant's bound from now on (a pooled sandbox
        has no tenant when it starts); never raises."""

    async def stop(self, reason: str, limit: str = "exited") -> None: ...

    async def destroy(self) -> None: ...


@runtime_checkable
class StreamsOutput(Protocol):
    """A sandbox that can hand a running cell's output over while the cell runs (`local`);
    the others answer it once, with the cell. `execute` then takes `on_output`."""

    streams_output: bool

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
        on_output: OutputSink | None = None,
    ) -> ExecuteReply: ...


class Provider(Protocol):
    name: str
    capabilities: Capabilities

    async def create(
        self,
        sandbox_id: str,
        limits: Limits,
        *,
        fork_ready: bool = True,
        mounts: dict[str, Path] | None = None,
        revive: bool = False,
    ) -> Sandbox:
        """`fork_ready`: keep a checkpoint after every cell so a fork taken mid-cell still
        gets the last completed cell. `mounts`: durable directories at workspace-relative
        paths. `revive`: start again on the files of a sandbox whose process is gone."""
        ...

    async def fork(self, parent: Any, child_id: str) -> Sandbox: ...

    async def clone_repo(
        self, box: Any, url: str, ref: str | None, *, allow_local: bool
    ) -> None: ...

    async def discard(self, sandbox_id: str) -> None:
        """Remove what is left of a sandbox whose processes are gone (its files)."""
        ...

    async def close(self) -> None: ...
