"""Sandbox context: lifecycle events (`fleet.sandbox.<tenant>.<sandbox>`) and the broker's bus API.

Requests that create a sandbox go to the broker's queue group; every later request about one
sandbox goes to a per-sandbox subject only the replica holding its processes subscribes to; tool
callbacks from sandbox code go to the owning interpreter's inbox. `fleet_events.bus` names each
verb with its subject, request and reply types.

Every request carries a `request_id`: a retry gets the original answer. The wire types live
here because both the broker and the agent speak them and services never import each other.
"""

from datetime import datetime
from typing import Any, Literal

import msgspec

from fleet_events import subjects
from fleet_events.envelope import BlobRef, Event

BROKER = "sandbox-broker"


def sandbox_subject(tenant: str, sandbox: str) -> str:
    return subjects.SANDBOX.build(tenant=tenant, sandbox=sandbox)


def tenant_filter(tenant: str) -> str:
    return subjects.SANDBOX.filter(tenant=tenant)


# -- capabilities and limits ---------------------------------------------------------------


class Capabilities(msgspec.Struct, frozen=True, kw_only=True):
    """What a provider can honestly do; the isolation policy reads these, never the name."""

    fork: bool
    fork_keeps_repl_memory: bool
    durable_volumes: bool
    network_isolation: bool
    archive: bool


class Limits(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    memory_mb: int = 1024
    cpu_s_per_cell: int = 60
    cpu_s_total: int = 3600
    nproc: int = 64
    file_mb: int = 1024
    open_files: int = 256
    wall_s: float = 120.0


# -- lifecycle events ----------------------------------------------------------------------


class SandboxCreated(Event, frozen=True, kw_only=True, tag="sandbox.created"):
    """A clean sandbox started: what it was made from, so a child or replacement can be too."""

    sandbox: str
    provider: str
    replica: str
    workspace: str
    labels: dict[str, str] = {}
    limits: Limits = Limits()
    volume: str | None = None
    volume_subpath: str | None = None
    repo_url: str | None = None
    ref: str | None = None
    context_paths: list[str] = []
    local_checkout: bool = False


class SandboxForked(Event, frozen=True, kw_only=True, tag="sandbox.forked"):
    """A child sandbox holding the parent's REPL state as of its last completed cell."""

    sandbox: str
    parent: str
    provider: str
    replica: str
    workspace: str
    labels: dict[str, str] = {}
    limits: Limits = Limits()


class ContextOpened(Event, frozen=True, kw_only=True, tag="sandbox.context_opened"):
    """A REPL context (one interpreter's namespace) opened in a sandbox."""

    sandbox: str
    context: str
    interpreter: str | None = None


class ContextClosed(Event, frozen=True, kw_only=True, tag="sandbox.context_closed"):
    """An interpreter shut down: its context is gone, the sandbox lives on."""

    sandbox: str
    context: str


class LimitExceeded(Event, frozen=True, kw_only=True, tag="sandbox.limit_exceeded"):
    """A sandbox stopped by one of its limits; its REPL memory is gone, its files are not."""

    sandbox: str
    limit: Literal["wall_time", "cpu_time", "memory", "frame_size", "protocol", "exited", "inodes"]
    detail: str


class DiskFull(Event, frozen=True, kw_only=True, tag="sandbox.disk_full"):
    """A sandbox's fork family reached its disk quota (`limit`: "bytes" or "inodes"): the
    kernel refuses its writes (`ENOSPC`) until files are deleted; the sandbox runs on."""

    sandbox: str
    limit: Literal["bytes", "inodes"]
    detail: str


class SandboxDeleted(Event, frozen=True, kw_only=True, tag="sandbox.deleted"):
    """A sandbox's processes and workspace are gone (its volume, if any, is kept)."""

    sandbox: str
    reason: str = "requested"


class ChildIsolationDecided(Event, frozen=True, kw_only=True, tag="sandbox.child_decided"):
    """Which branch of the isolation policy gave a child its sandbox, and why."""

    parent: str
    child: str | None
    mode: Literal["auto", "context"]
    branch: Literal["fork", "clean_volume", "clean_fallback", "context", "refused"]
    reason: str
    context: str | None = None


class SandboxReplaced(Event, frozen=True, kw_only=True, tag="sandbox.replaced"):
    """A session's sandbox was gone; a new one runs on the same volume (REPL memory lost).
    `sandbox == replaced`: the same sandbox revived in place; `replica` holds it from now on."""

    sandbox: str
    replaced: str
    reason: str
    replica: str | None = None


class CreateRefused(Event, frozen=True, kw_only=True, tag="sandbox.create_refused"):
    """A well-formed create the broker declined: the tenant's provider (`sandbox_provider`)
    is not configured on the broker. `sandbox` is the id it would have had (the subject key);
    nothing was started. At most one is recorded per tenant and replica per
    FLEET_SANDBOX_REFUSAL_RECORD_S: `unrecorded` counts the refusals answered since the last
    one recorded and not recorded themselves (a tenant cannot grow the log without bound)."""

    sandbox: str
    provider: str
    reason: str
    labels: dict[str, str] = {}
    unrecorded: int = 0


class SandboxArchived(Event, frozen=True, kw_only=True, tag="sandbox.archived"):
    """The provider archived the sandbox (its files kept in the provider's cold storage, nothing
    running); no broker serves it from here on. Only a provider whose capabilities say
    `archive` does this (Daytona)."""

    sandbox: str
    provider: str
    reason: str = ""


class ArchiveRefused(Event, frozen=True, kw_only=True, tag="sandbox.archive_refused"):
    """A well-formed archive the broker declined (the sandbox's provider cannot archive, or it
    has running children); the sandbox runs on untouched."""

    sandbox: str
    provider: str
    reason: str


EVENTS: tuple[type[Event], ...] = (
    SandboxCreated,
    SandboxForked,
    ContextOpened,
    ContextClosed,
    LimitExceeded,
    DiskFull,
    SandboxDeleted,
    ChildIsolationDecided,
    SandboxReplaced,
    CreateRefused,
    SandboxArchived,
    ArchiveRefused,
)

# -- requests and replies -----------------------------------------------------------------


class Request(msgspec.Struct, frozen=True, kw_only=True):
    request_id: str
    tenant: str


class CreateSandbox(Request, frozen=True, kw_only=True):
    """`volume`: a durable host directory `<tenant>/<volume>/<volume_subpath>` mounted at
    `workspace/volume`. `repo_url` at `ref` is cloned into `workspace/repo`. `context_files`
    (object-store blobs) are written into the workspace; `local_checkout` says they are an
    uploaded checkout with no repo URL (children then get a text snapshot of them)."""

    labels: dict[str, str] = {}
    limits: Limits | None = None
    volume: str | None = None
    volume_subpath: str | None = None
    repo_url: str | None = None
    ref: str | None = None
    context_files: dict[str, BlobRef] = {}
    context_paths: list[str] = []
    local_checkout: bool = False
    fork_ready: bool = True  # keep a per-cell checkpoint so mid-cell forks see the last cell


class SandboxRef(Request, frozen=True, kw_only=True):
    sandbox: str


class ForkSandbox(SandboxRef, frozen=True, kw_only=True):
    labels: dict[str, str] = {}


class GetSandbox(SandboxRef, frozen=True, kw_only=True):
    pass


class DeleteSandbox(SandboxRef, frozen=True, kw_only=True):
    reason: str = "requested"


class ArchiveSandbox(SandboxRef, frozen=True, kw_only=True):
    """Archive the sandbox with its provider (files kept, nothing running); refused, as an
    `ArchiveRefused` and a `conflict` error, where the provider cannot."""

    reason: str = "requested"


class ListSandboxes(Request, frozen=True, kw_only=True):
    """One page of the tenant's sandboxes, oldest first; pass the reply's `next_cursor` back
    for the next page."""

    session: str | None = None
    cursor: str | None = None
    limit: int = 100


class BuildChild(SandboxRef, frozen=True, kw_only=True):
    """One operation for every recursive child: the broker applies the isolation policy
    (`rlm_child_isolation_mode`, `rlm_child_fork_fallback` from the config KV)."""

    context: str
    labels: dict[str, str] = {}


class ResumeSandbox(SandboxRef, frozen=True, kw_only=True):
    """The session's sandbox, or a replacement on the same volume if it is gone."""


class ListVolume(Request, frozen=True, kw_only=True):
    volume: str
    path: str = ""
    max_entries: int = 1000


class ReadVolumeFile(Request, frozen=True, kw_only=True):
    """`prefix`: answer the first `max_bytes` of a larger file (a preview) instead of refusing
    it as too large."""

    volume: str
    path: str
    max_bytes: int = 1024 * 1024
    prefix: bool = False


class OpenContext(SandboxRef, frozen=True, kw_only=True):
    context: str
    interpreter: str | None = None


class CloseContext(SandboxRef, frozen=True, kw_only=True):
    context: str


class Execute(SandboxRef, frozen=True, kw_only=True):
    """Run one cell. `variables` maps names to content hashes; `blobs` carries the JSON text
    of the hashes the sandbox has not seen (it answers `missing` for any it lacks), or
    `blob_refs` the object-store reference of those too big to travel inline."""

    context: str
    code: str
    variables: dict[str, str] = {}
    blobs: dict[str, str] = {}
    blob_refs: dict[str, BlobRef] = {}  # big variables, staged in the object store
    tools: list[str] = []
    output_fields: list[dict[str, Any]] | None = None
    wall_s: float | None = None
    callback_timeout_s: float = 600.0


class InterruptCell(SandboxRef, frozen=True, kw_only=True):
    """Stop the cell running in `context` now; the sandbox and its REPL state survive."""

    context: str


class Interrupted(msgspec.Struct, frozen=True, kw_only=True):
    """`interrupted`: a cell was running and was stopped (False: nothing was running)."""

    interrupted: bool


class PutFile(SandboxRef, frozen=True, kw_only=True):
    path: str
    data: bytes | None = None
    blob: BlobRef | None = None


class GetFile(SandboxRef, frozen=True, kw_only=True):
    path: str
    max_bytes: int = 8 * 1024 * 1024
    via_blob: bool = False


class Ack(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool = True


class SandboxInfo(msgspec.Struct, frozen=True, kw_only=True):
    sandbox: str
    tenant: str
    provider: str
    replica: str
    status: Literal["running", "stopped", "deleted"]
    workspace: str
    parent: str | None = None
    labels: dict[str, str] = {}
    contexts: list[str] = []
    stopped_reason: str | None = None
    pid: int | None = None
    uid: int | None = None
    capabilities: Capabilities | None = None
    volume: str | None = None
    volume_subpath: str | None = None
    repo_url: str | None = None
    ref: str | None = None
    context_paths: list[str] = []


class SandboxList(msgspec.Struct, frozen=True, kw_only=True):
    items: list[SandboxInfo]
    next_cursor: str | None = None


class ExecuteReply(msgspec.Struct, frozen=True, kw_only=True):
    """`terminal`: the sandbox is stopped (a limit, a crash, a protocol violation)."""

    kind: Literal["result", "final", "syntax", "error", "missing", "terminal"]
    value: Any = None
    stdout: str = ""
    error: str = ""
    missing: list[str] = []
    truncated: bool = False  # stdout or value was cut to fit the reply limit (the text says so)


class ChildSandbox(msgspec.Struct, frozen=True, kw_only=True):
    """Where the child runs: `sandbox` and the `context` name its interpreter opens."""

    sandbox: str
    context: str
    branch: Literal["fork", "clean_volume", "clean_fallback", "context"]
    reason: str
    workspace: str
    context_paths: list[str] = []
    volume_subpath: str | None = None


class VolumeEntry(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    kind: Literal["file", "dir", "other"]
    size: int


class VolumeListing(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    entries: list[VolumeEntry]
    truncated: bool = False


class FileInfo(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    size: int
    sha256: str


class FileContent(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    size: int
    sha256: str
    data: bytes | None = None
    blob: BlobRef | None = None


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """A host tool called by sandbox code, relayed to the interpreter that owns the context."""

    request_id: str
    sandbox: str
    context: str
    name: str
    args: list[Any] = []
    kwargs: dict[str, Any] = {}


class ToolReply(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    value: Any = None
    error: str = ""


class CellOutput(msgspec.Struct, frozen=True, kw_only=True):
    """What a running cell printed since the last one (a preview, published while the cell
    runs; the cell's reply and its `run.cell_executed` carry all of its output). `seq`
    counts a cell's chunks from 1."""

    sandbox: str
    context: str
    text: str
    seq: int = 1


# -- the Daytona probe (`runtime/tests/daytona`) -------------------------------------------


class TestDaytona(Request, frozen=True, kw_only=True):
    """Probe the broker's Daytona provider: its configuration, its circuit, one live call."""

    __test__ = False  # not a pytest class, whatever its name

    timeout_s: float = 20.0


class ProbeCheck(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    ok: bool
    detail: str = ""


class DaytonaProbe(msgspec.Struct, frozen=True, kw_only=True):
    """The earlier system's probe result: {kind, ok, preflight_ok, checked_at, checks,
    guidance, latency_ms, error}; `configured` is False when the broker has no Daytona."""

    kind: str = "daytona"
    ok: bool
    preflight_ok: bool
    configured: bool
    checked_at: datetime
    checks: list[ProbeCheck]
    guidance: list[str] = []
    latency_ms: float | None = None
    error: str = ""
    replica: str = ""
