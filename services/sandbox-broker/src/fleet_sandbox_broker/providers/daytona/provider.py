"""`DaytonaProvider` and `DaytonaSandbox`: the broker's provider contract on `AsyncDaytona`.

A cell runs in a Daytona interpreter context (`code_interpreter.run_code`), which keeps its
variables between cells. Its answer never travels on stdout (which the cell controls): the
wrapper writes it to a file named by a per-execution token, and the broker reads that file
back through the toolbox API of *this* sandbox, so what the broker reads is tied to the
sandbox it asked, not to anything the cell prints.
"""

import asyncio
import contextlib
import hashlib
import json
import math
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from daytona import (
    AsyncDaytona,
    AsyncSandbox,
    CreateSandboxFromImageParams,
    CreateSandboxFromSnapshotParams,
    DaytonaConfig,
    DaytonaError,
    DaytonaTimeoutError,
    ListSandboxesQuery,
    Resources,
    VolumeMount,
)

from fleet_events.envelope import utc_now
from fleet_events.ids import check_id
from fleet_events.sandbox import (
    Capabilities,
    DaytonaProbe,
    ExecuteReply,
    Limits,
    ProbeCheck,
    ToolCall,
)
from fleet_sandbox_broker.domain import Stopwatch
from fleet_sandbox_broker.errors import SandboxError, SandboxStopped, TooLarge
from fleet_sandbox_broker.providers.base import ToolRelay
from fleet_sandbox_broker.providers.daytona.callbacks import CallbackGate, CallbackRefused
from fleet_sandbox_broker.providers.daytona.resilience import Caller, Circuit, translate

HOME = PurePosixPath("/home/daytona")
POLL_S = 0.02  # how often a running cell's call frames are looked for
WALL = "the wall time ran out"  # what the frame pump returns when it stopped the cell for it
LABEL = "fleet-rlm"  # every sandbox carries fleet-rlm/sandbox, /replica and /parent labels


@dataclass(frozen=True)
class DaytonaSettings:
    """Passed in explicitly: the SDK would otherwise read DAYTONA_* from `.env` in the cwd."""

    api_key: str
    api_url: str
    target: str
    replica: str
    snapshot: str | None = None  # a linux-vm snapshot is what makes fork possible
    # an image instead of a snapshot: then each sandbox gets resources from its Limits (a
    # snapshot's sandboxes have the snapshot's resources; the SDK sends none with one)
    image: str | None = None
    cpu: int = 1  # cores per sandbox from an image (Limits has CPU seconds, not cores)
    disk_gb: int = 3  # disk per sandbox from an image, at least the largest file allowed
    vm: bool = True  # does `snapshot` give linux-vm sandboxes (so fork is declared)
    auto_stop_min: int = 15
    auto_archive_min: int = 60 * 24
    auto_delete_min: int = -1
    network_block_all: bool = False
    deadline_s: float = 60.0
    attempts: int = 5
    circuit_threshold: int = 5
    circuit_cool_s: float = 30.0
    labels: dict[str, str] = field(default_factory=dict)
    max_tool_calls: int = 8  # host calls in flight per sandbox
    host_wait_s: float = 600.0  # the longest a cell's host calls may keep it waiting, in all
    probe_cache_s: float = 10.0  # a probe's answer is reused this long


def _slot(context: str) -> str:
    """A context's directory under `.fleet/`: cells of one context run one at a time, so each
    cell clears what the last one left (answers, frames) and nothing piles up."""
    return ".fleet/" + hashlib.sha256(context.encode()).hexdigest()[:16]


# Defined once per interpreter context (the first cell of a context sends it, later cells only
# call it): compiling this per cell cost ~1.4 ms, and the per-cell directories it used to make
# and remove (rmdir is ~1 ms a directory on these disks) ~8 ms more.
_HELPER = r"""
import ast as __fa, json as __fj, os as __fo, shutil as __fsh, sys as __fsys
import tempfile as __ftmp
import threading as __fth, time as __fti


class __FleetSubmit(BaseException):
    pass


def __fleet_run(code, slot, token, variables, tools, declared):
    g = globals()
    out = __fsys.stdout  # where the answer goes, even if the cell rebinds sys.stdout
    d = __fo.path.join(__fo.getcwd(), slot)
    if __fo.path.isdir(d):  # host-call frames of the context's last cell
        __fsh.rmtree(d, ignore_errors=True)
    # decoded per cell (a cell may mutate what it was given), except what cannot be mutated:
    # a string, number, boolean or null is decoded once per context and the one object handed
    # to every cell, as the local runner does (RLM re-sends its inputs every iteration)
    cache = g.setdefault("__fleet_immutable", {})
    for name, (digest, text) in variables.items():
        if digest in cache:
            g[name] = cache[digest]
            continue
        g[name] = __fj.loads(text)
        if isinstance(g[name], (str, int, float, bool, type(None))):
            cache[digest] = g[name]
    names = declared or ["output"]
    sub = []

    def trace(frame, event, arg):
        if event == "line":
            raise __FleetSubmit(sub[0])
        return trace

    def SUBMIT(*args, **kwargs):
        if len(args) > len(names):
            raise TypeError("SUBMIT takes " + str(len(names)) + " value(s) ("
                            + ", ".join(names) + "), got " + str(len(args)))
        value = {**dict(zip(names, args)), **kwargs}
        missing = [n for n in declared if n not in value]
        if missing:
            raise TypeError("SUBMIT is missing output field(s): " + ", ".join(missing))
        sub[:] = [value]
        # an `except:` in the cell cannot carry on: every cell frame raises again at its next
        # line
        __fsys.settrace(lambda *a: None)
        frame = __fsys._getframe(1)
        while frame is not None and frame.f_code.co_filename == "<fleet-cell>":
            frame.f_trace = trace
            frame = frame.f_back
        raise __FleetSubmit(value)

    g["SUBMIT"] = SUBMIT
    calls = __fo.path.join(d, "calls", token)
    replies = __fo.path.join(d, "replies", token)
    seq = [0, __fth.Lock()]

    def tool(name):
        def call(*args, **kwargs):
            with seq[1]:
                seq[0] += 1
                n = seq[0]
                if n == 1:  # made by the first call: a cell without host calls makes nothing
                    __fo.makedirs(calls, exist_ok=True)
                    __fo.makedirs(replies, exist_ok=True)
            tmp = __fo.path.join(calls, "." + str(n) + ".tmp")
            with open(tmp, "w") as f:
                f.write(__fj.dumps({"seq": n, "name": name, "args": list(args),
                                    "kwargs": kwargs}))
            __fo.replace(tmp, __fo.path.join(calls, str(n) + ".json"))
            path = __fo.path.join(replies, str(n) + ".json")
            while True:
                try:
                    with open(path) as f:
                        reply = __fj.loads(f.read())
                    break
                except (OSError, ValueError):
                    __fti.sleep(0.005)
            if reply["ok"]:
                return reply["value"]
            raise RuntimeError(reply["error"])

        call.__fleet_tool__ = True
        return call

    # the tools of this cell only: a stub bound for an earlier cell and no longer offered is
    # removed (a name the cell's code rebound to something else is its own, and kept)
    for name in set(g.get("__fleet_tools", ())) - set(tools):
        if getattr(g.get(name), "__fleet_tool__", False) is True:
            del g[name]
    g["__fleet_tools"] = list(tools)
    for name in tools:
        g[name] = tool(name)
    # output written below Python (os.write, a subprocess) is the cell's output too, whatever
    # the kernel captures: fds 1 and 2 go to a file of the context's while the cell runs
    capture = g.get("__fleet_capture")
    if capture is None:
        capture = g["__fleet_capture"] = __ftmp.TemporaryFile()
    capture.seek(0)
    capture.truncate()
    for stream in (__fsys.stdout, __fsys.stderr, __fsys.__stdout__, __fsys.__stderr__):
        try:
            stream.flush()
        except Exception:
            pass
    saved = [__fo.dup(1), __fo.dup(2)]
    __fo.dup2(capture.fileno(), 1)
    __fo.dup2(capture.fileno(), 2)
    try:
        tree = __fa.parse(code, "<fleet-cell>")
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], __fa.Expr) else None
        exec(compile(tree, "<fleet-cell>", "exec"), g)
        value = None
        if last is not None:
            value = eval(compile(__fa.Expression(last.value), "<fleet-cell>", "eval"), g)
        answer = {"kind": "result", "value": value}
    except __FleetSubmit as done:
        answer = {"kind": "final", "value": done.args[0]}
    except SyntaxError as exc:
        answer = {"kind": "syntax", "error": str(exc)}
    except Exception as exc:
        answer = {"kind": "error", "error": type(exc).__name__ + ": " + str(exc)}
    finally:
        __fsys.settrace(None)
        for stream in (__fsys.__stdout__, __fsys.__stderr__):
            try:
                stream.flush()
            except Exception:
                pass
        __fo.dup2(saved[0], 1)
        __fo.dup2(saved[1], 2)
        __fo.close(saved[0])
        __fo.close(saved[1])
    if sub:
        answer = {"kind": "final", "value": sub[0]}
    capture.seek(0)
    below = capture.read().decode("utf-8", "replace")
    # then the answer, framed by this execution's token, after everything the cell printed
    # (printable ASCII: no control characters for a kernel's stream to mangle)
    out.write(below + "[fleet-answer " + token + "]" + __fj.dumps(answer, default=repr)
              + "[/fleet-answer " + token + "]")
    out.flush()
"""
HELPER_NAME = "__fleet_run_" + hashlib.sha256(_HELPER.encode()).hexdigest()[:12]
_DEFINE = _HELPER.replace("def __fleet_run(", f"def {HELPER_NAME}(")
ANSWERS = frozenset({"result", "final", "syntax", "error"})  # what a cell's answer may be


def _wrapper(
    code: str,
    slot: str,
    token: str,
    variables: dict[str, list[str]],
    tools: list[str],
    names: list[str],
    *,
    define: bool = True,
) -> str:
    """The cell as sent: one call to the helper, defined first if this context may lack it
    (`define=False` once the context has run one, so its ~5 KB travel only once)."""
    args = json.dumps([code, slot, token, variables, tools, names])
    call = f"{HELPER_NAME}(*__import__('json').loads({args!r}))\n"
    if not define:
        return call
    return f"if {HELPER_NAME!r} not in globals():\n    exec({_DEFINE!r}, globals())\n{call}"


def _answer(stdout: str, token: str) -> tuple[dict[str, Any] | None, str]:
    """The answer the helper framed with `token` at the end of the output, and the output
    without it. The cell could print a frame of its own (it can read its token), but it can
    only choose its own answer that way, which SUBMIT lets it do anyway: identity comes from
    the sandbox the output was read from, never from the output."""
    begin, end = f"[fleet-answer {token}]", f"[/fleet-answer {token}]"
    at = stdout.rfind(begin)
    stop = stdout.find(end, at + len(begin)) if at >= 0 else -1
    if stop < 0:
        return None, stdout
    try:
        answer = json.loads(stdout[at + len(begin) : stop])
    except ValueError:
        return None, stdout
    if not isinstance(answer, dict) or answer.get("kind") not in ANSWERS:
        return None, stdout
    return answer, stdout[:at] + stdout[stop + len(end) :]


def resources(limits: Limits, settings: DaytonaSettings) -> Resources:
    """Daytona's resources for a sandbox of these limits: memory rounded up to whole GiB, disk
    at least the largest file a cell may write (`file_mb`), cores from the settings."""
    return Resources(
        cpu=settings.cpu,
        memory=max(1, math.ceil(limits.memory_mb / 1024)),
        disk=max(settings.disk_gb, math.ceil(limits.file_mb / 1024)),
    )


def volume_name(tenant: str, volume: str, child: bool = False) -> str:
    """A tenant's volume on Daytona: `fleet.<tenant>.<volume>` ('.' is in no id, so two tenants'
    names never meet); clean children's volumes live in `fleet.<tenant>.<volume>.children`,
    outside the parent's volume, as the local provider keeps them."""
    name = f"fleet.{check_id('tenant', tenant)}.{check_id('volume', volume)}"
    return f"{name}.children" if child else name


class DaytonaSandbox:
    def __init__(
        self, provider: "DaytonaProvider", sandbox_id: str, remote: AsyncSandbox, limits: Limits
    ) -> None:
        self.id = sandbox_id
        self.remote = remote
        self.workspace = Path(str(HOME))
        self.limits = limits
        self.contexts: set[str] = set()
        self.on_stop: list[Callable[[Any], Awaitable[None]]] = []
        self.on_full: list[Callable[[Any, str, str], Awaitable[None]]] = []  # Daytona's own disk
        self._provider = provider
        self._remote_contexts: dict[str, Any] = {}
        self._known: dict[str, str] = {}  # variable digest -> JSON text, as the local runner keeps
        self._defined: set[str] = set()  # contexts whose interpreter holds the cell helper
        self._stopped: tuple[str, str] | None = None

    @property
    def uid(self) -> int | None:
        return None

    @property
    def pid(self) -> int | None:
        return None

    @property
    def running(self) -> bool:
        return self._stopped is None

    @property
    def stopped_reason(self) -> str | None:
        return None if self._stopped is None else self._stopped[0]

    @property
    def stopped_limit(self) -> str | None:
        return None if self._stopped is None else self._stopped[1]

    def _alive(self) -> None:
        if self._stopped is not None:
            raise SandboxStopped(f"sandbox {self.id} has stopped: {self._stopped[0]}")

    async def open_context(self, context: str) -> None:
        self._alive()
        if context not in self._remote_contexts:
            ctx = await self._provider.call(
                f"open context {context!r} of {self.id}",
                lambda: self.remote.code_interpreter.create_context(cwd=str(HOME)),
            )
            self._remote_contexts[context] = ctx
        self.contexts.add(context)

    async def close_context(self, context: str) -> None:
        ctx = self._remote_contexts.pop(context, None)
        self.contexts.discard(context)
        self._defined.discard(context)
        if ctx is not None:
            await self._provider.call(
                f"close context {context!r} of {self.id}",
                lambda: self.remote.code_interpreter.delete_context(ctx),
            )

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
    ) -> ExecuteReply:
        self._alive()
        self._known.update(blobs)
        missing = sorted({h for h in variables.values() if h not in self._known})
        if missing:
            return ExecuteReply(kind="missing", missing=missing)
        if context not in self._remote_contexts:
            await self.open_context(context)
        ctx = self._remote_contexts[context]
        token = self._provider.gate.issue(self.id, context, secrets.token_hex(8))
        bound = {name: [h, self._known[h]] for name, h in variables.items()}
        slot = _slot(context)
        names = [str(f["name"]) for f in output_fields or []]
        defined = context in self._defined
        # The wall limit is the broker's stopwatch, paused while a host call is pending (as the
        # local provider's); Daytona's own timeout is only a backstop above it, since its clock
        # cannot be paused: the wall time plus the time host calls may take.
        watch = Stopwatch(wall_s)
        backstop = max(1, math.ceil(wall_s + self._provider.settings.host_wait_s))

        async def cell() -> Any:
            try:
                source = _wrapper(code, slot, token, bound, tools, names, define=not defined)
                run = await self.remote.code_interpreter.run_code(
                    source, context=ctx, timeout=backstop
                )
                if defined and run.error is not None and HELPER_NAME in str(run.error.value):
                    # the context lost the helper (its interpreter restarted): define it again
                    source = _wrapper(code, slot, token, bound, tools, names)
                    run = await self.remote.code_interpreter.run_code(
                        source, context=ctx, timeout=backstop
                    )
                return run
            except DaytonaTimeoutError:
                return None  # the cell's own wall time, not Daytona failing: no retry, no circuit

        running = asyncio.create_task(self._provider.call(f"exec in {self.id}", cell))
        try:
            fatal = await self._pump(slot, token, running, relay, watch)
        finally:
            self._provider.gate.revoke(token)
        if fatal is not None and fatal is not WALL:
            await self.close_context(context)
            return ExecuteReply(kind="error", error=f"{fatal}; the context's variables are lost")
        run = None if fatal is WALL else await running
        if run is None:
            reason = (
                f"execution exceeded the {wall_s:g} s wall-time limit (time waiting on host "
                "tools not counted)"
            )
            await self.stop(reason, "wall_time")
            with contextlib.suppress(asyncio.CancelledError):
                await running
            # the cell may still be running in Daytona: its interpreter goes with its context
            # (best effort: the sandbox is stopped, and deleted or reaped after this)
            with contextlib.suppress(SandboxError):
                await self.close_context(context)
            return ExecuteReply(kind="terminal", error=reason)
        self._defined.add(context)
        answer, printed = _answer(run.stdout, token)
        stdout = printed + run.stderr
        if run.error is not None:  # the wrapper itself failed: only an interpreter-level error
            return ExecuteReply(
                kind="error", stdout=stdout, error=f"{run.error.name}: {run.error.value}"
            )
        if answer is None:
            return ExecuteReply(
                kind="error", stdout=stdout,
                error="the cell left no answer (it closed or replaced its output stream, or "
                "ended its process); the context's variables may be lost",
            )  # fmt: skip
        return ExecuteReply(
            kind=answer["kind"],
            value=answer.get("value"),
            stdout=stdout,
            error=str(answer.get("error", "")),
        )

    async def _pump(
        self,
        slot: str,
        token: str,
        running: "asyncio.Task[Any]",
        relay: ToolRelay,
        watch: Stopwatch,
    ) -> str | None:
        """Pull this execution's call frames through this sandbox's toolbox until it ends.

        What is read here is attributed to this sandbox because it was read from it; the frame
        only says which tool and with what. Returns the reason when the gate stops the cell.
        """
        gate = self._provider.gate
        calls, replies = f"{slot}/calls/{token}", f"{slot}/replies/{token}"
        seen: set[str] = set()
        answering: set[asyncio.Task[None]] = set()

        async def answer(stem: str, call: ToolCall | None, error: str = "") -> None:
            if call is not None:
                watch.pause()  # time waiting on the host is not the cell's
                try:
                    reply = await relay(call)
                finally:
                    watch.resume()
                    gate.finished(self.id)
                body = {"ok": reply.ok, "value": reply.value, "error": reply.error}
            else:
                body = {"ok": False, "value": None, "error": error}
            await self.write_file(f"{replies}/{stem}.json", json.dumps(body).encode())

        try:
            while True:
                # waited on first: a cell that makes no host call costs no listing
                await asyncio.wait({running}, timeout=POLL_S)
                if running.done():
                    break
                if not watch.paused and watch.remaining() <= 0:
                    running.cancel()
                    return WALL
                try:
                    listed = await self.remote.fs.list_files(calls)
                except DaytonaError:
                    listed = []  # not made yet: the cell has not started
                for entry in listed:
                    name = str(entry.name)
                    stem = name.removesuffix(".json")
                    if name in seen or not name.endswith(".json") or not stem.isdigit():
                        continue
                    seen.add(name)
                    raw = await self.read_file(f"{calls}/{name}", gate.max_frame_bytes + 1)
                    try:
                        call = gate.admit(self.id, token, raw)
                        if call.request_id.rsplit(":", 1)[1] != stem:
                            gate.finished(self.id)
                            raise CallbackRefused(
                                f"callback refused: frame {stem} says another seq"
                            )
                    except CallbackRefused as refused:
                        if refused.fatal:
                            running.cancel()
                            return str(refused)
                        task = asyncio.create_task(answer(stem, None, str(refused)))
                    else:
                        task = asyncio.create_task(answer(stem, call))
                    answering.add(task)
                    task.add_done_callback(answering.discard)
        finally:
            for task in answering:
                task.cancel()
        return None

    async def interrupt(self, context: str) -> bool:
        """Daytona's interpreter has no interrupt: the context is dropped (its state with it)."""
        if context not in self._remote_contexts:
            return False
        await self.close_context(context)
        return True

    async def write_file(self, path: str, data: bytes) -> None:
        self._alive()
        # bytes, never a str: the SDK reads a str as a path on the broker's own disk
        await self._provider.call(
            f"write {path!r} in {self.id}", lambda: self.remote.fs.upload_file(bytes(data), path)
        )

    async def read_file(self, path: str, max_bytes: int) -> bytes:
        self._alive()
        data = await self._provider.call(
            f"read {path!r} in {self.id}", lambda: self.remote.fs.download_file(path)
        )
        if len(data) > max_bytes:
            raise TooLarge(f"{path} is {len(data)} bytes, over the {max_bytes} byte read limit")
        return bytes(data)

    async def bind_tenant(self, tenant: str) -> None:
        """Nothing: a Daytona sandbox's tasks are bounded by its own VM."""

    async def stop(self, reason: str, limit: str = "exited") -> None:
        if self._stopped is not None:
            return
        self._stopped = (reason, limit)
        for hook in self.on_stop:
            await hook(self)

    async def destroy(self) -> None:
        await self.stop("deleted")
        await self._provider.delete_tree(self.id)

    async def archive(self) -> None:
        await self._provider.call(f"archive {self.id}", lambda: self.remote.archive())


class DaytonaProvider:
    name = "daytona"
    # its sandboxes live on Daytona, not on this host: any broker with the key can act on them
    # (a session's sandbox no broker holds is revived in place on `resume`, found by its label)
    remote = True

    def __init__(self, settings: DaytonaSettings) -> None:
        self.settings = settings
        self.capabilities = Capabilities(
            fork=settings.vm,
            fork_keeps_repl_memory=False,  # a Daytona fork copies the filesystem, not a process
            durable_volumes=True,
            network_isolation=settings.network_block_all,
            archive=True,
        )
        self.circuit = Circuit(settings.circuit_threshold, settings.circuit_cool_s)
        self.call = Caller(self.circuit, settings.attempts, settings.deadline_s)
        self.gate = CallbackGate(max_in_flight=settings.max_tool_calls)
        # when, whether the circuit was open then, and what it said
        self._probed: tuple[float, bool, DaytonaProbe] | None = None
        self._probing: asyncio.Future[DaytonaProbe] | None = None
        self.client = AsyncDaytona(
            DaytonaConfig(
                api_key=settings.api_key, api_url=settings.api_url, target=settings.target
            )
        )

    def _labels(self, sandbox_id: str, parent: str | None) -> dict[str, str]:
        return {
            **self.settings.labels,
            f"{LABEL}/sandbox": sandbox_id,
            f"{LABEL}/replica": self.settings.replica,
            f"{LABEL}/parent": parent or "",
        }

    async def _volume(self, name: str) -> str:
        """A volume's id once it is `ready` (Daytona refuses to mount one that is not)."""
        started = time.monotonic()
        while True:
            volume = await self.call(
                f"volume {name!r}", lambda: self.client.volume.get(name, create=True)
            )
            if str(getattr(volume.state, "value", volume.state)) == "ready":
                return str(volume.id)
            if time.monotonic() - started > self.settings.deadline_s:
                raise SandboxError(
                    f"Daytona volume {name!r} was not ready within "
                    f"{self.settings.deadline_s:g} s (state {volume.state})"
                )

    async def create(
        self,
        sandbox_id: str,
        limits: Limits,
        *,
        fork_ready: bool = True,
        mounts: dict[str, Path] | None = None,
        revive: bool = False,
    ) -> DaytonaSandbox:
        """`mounts` maps a workspace-relative path to `<volume name>/<subpath>`. `revive`: the
        Daytona sandbox outlives a dead broker; it is found by its label and taken back."""
        found = await self.find(sandbox_id=sandbox_id) if revive else []
        if found:
            remote = found[0]
            if str(getattr(remote.state, "value", remote.state)) != "started":
                await self.call(
                    f"start {sandbox_id}", lambda: remote.start(self.settings.deadline_s)
                )
            return DaytonaSandbox(self, sandbox_id, remote, limits)
        volumes = []
        for rel, spec in (mounts or {}).items():
            if PurePosixPath(str(spec)).is_absolute():
                raise SandboxError(
                    f"the daytona provider mounts Daytona volumes given as '<volume>/<subpath>', "
                    f"not a host directory ({spec}): the broker names them (volume_mount)"
                )
            name, *sub = PurePosixPath(str(spec)).parts
            volume_id = await self._volume(name)
            volumes.append(
                VolumeMount(
                    volume_id=volume_id, mount_path=str(HOME / rel), subpath="/".join(sub) or None
                )
            )
        common: dict[str, Any] = {
            "labels": self._labels(sandbox_id, None),
            "auto_stop_interval": self.settings.auto_stop_min,
            "auto_archive_interval": self.settings.auto_archive_min,
            "auto_delete_interval": self.settings.auto_delete_min,
            "network_block_all": self.settings.network_block_all,
            "volumes": volumes or None,
            "env_vars": {},  # nothing of the broker's environment: sandbox code never sees it
        }
        params: CreateSandboxFromImageParams | CreateSandboxFromSnapshotParams
        if self.settings.image is not None:
            params = CreateSandboxFromImageParams(
                image=self.settings.image, resources=resources(limits, self.settings), **common
            )
        else:
            params = CreateSandboxFromSnapshotParams(snapshot=self.settings.snapshot, **common)
        remote = await self.call(
            f"create {sandbox_id}",
            lambda: self.client.create(params, timeout=self.settings.deadline_s),
        )
        return DaytonaSandbox(self, sandbox_id, remote, limits)

    async def fork(self, parent: DaytonaSandbox, child_id: str) -> DaytonaSandbox:
        remote = await self.call(
            f"fork {parent.id}",
            lambda: parent.remote.fork(name=child_id, timeout=self.settings.deadline_s),
        )
        labels = {**remote.labels, **self._labels(child_id, parent.id)}
        await self.call(f"label {child_id}", lambda: remote.set_labels(labels))
        child = DaytonaSandbox(self, child_id, remote, parent.limits)
        child.contexts = set(parent.contexts)  # same names; fresh interpreters (no REPL memory)
        return child

    async def clone_repo(
        self, box: DaytonaSandbox, url: str, ref: str | None, *, allow_local: bool
    ) -> None:
        await self.call(
            f"clone into {box.id}",
            lambda: box.remote.git.clone(url, str(HOME / "repo"), commit_id=ref),
        )

    async def find(
        self, sandbox_id: str | None = None, parent: str | None = None
    ) -> list[AsyncSandbox]:
        # by id or parent across replicas (a taken-over sandbox was labelled by another one)
        labels = {} if sandbox_id or parent else {f"{LABEL}/replica": self.settings.replica}
        if sandbox_id is not None:
            labels[f"{LABEL}/sandbox"] = sandbox_id
        if parent is not None:
            labels[f"{LABEL}/parent"] = parent

        async def listed() -> list[AsyncSandbox]:
            return [s async for s in self.client.list(ListSandboxesQuery(labels=labels))]

        return await self.call("list sandboxes", listed)

    async def delete_tree(self, sandbox_id: str) -> None:
        """Children first: Daytona refuses to delete a parent with live forks."""
        for child in await self.find(parent=sandbox_id):
            await self.delete_tree(child.labels[f"{LABEL}/sandbox"])
        for remote in await self.find(sandbox_id=sandbox_id):

            async def delete(box: AsyncSandbox = remote) -> None:
                await box.delete(self.settings.deadline_s)

            await self.call(f"delete {sandbox_id}", delete)

    async def discard(self, sandbox_id: str) -> None:
        await self.delete_tree(sandbox_id)

    def volume_mount(self, tenant: str, volume: str, subpath: str | None) -> Path:
        """What the broker mounts for a durable volume: `<Daytona volume>/<subpath>` (a
        clean child's `.children/<child>` is the child's own volume's subpath `<child>`)."""
        head, _, child = (subpath or "").partition("/")
        if head == ".children":
            return Path(volume_name(tenant, volume, child=True)) / check_id("sandbox", child)
        return Path(volume_name(tenant, volume), *(subpath or "").split("/"))

    def health(self) -> dict[str, object]:
        """What a ping reports (`ok`, `checks`, `guidance`, `latency_ms`)."""
        return self.circuit.health()

    async def probe(self, timeout_s: float) -> DaytonaProbe:
        """`runtime/tests/daytona`, cached for `probe_cache_s` (as the earlier system cached
        its probes): a caller asking again and again costs Daytona one call per interval, and
        concurrent asks share one probe. The answer's `checked_at` says when it was taken; a
        circuit that opened or closed since makes it stale at once."""
        now, degraded = time.monotonic(), self.circuit.degraded
        if self._probed is not None:
            when, was_degraded, probed = self._probed
            if now - when < self.settings.probe_cache_s and was_degraded == degraded:
                return probed
        if self._probing is None or self._probing.done():
            self._probing = asyncio.ensure_future(self._probe(timeout_s))
        probed = await asyncio.shield(self._probing)
        self._probed = (time.monotonic(), self.circuit.degraded, probed)
        return probed

    async def _probe(self, timeout_s: float) -> DaytonaProbe:
        """The settings, the circuit, then one live call (a one-item page of this replica's
        sandboxes), let through even while the circuit is open: its outcome is evidence either
        way, so it is recorded in the circuit like any call."""
        s = self.settings
        url = urlsplit(s.api_url)
        try:
            port = url.port
        except ValueError:  # a port that is not a number
            port, url = None, urlsplit("")
        url_ok = url.scheme in ("http", "https") and bool(url.hostname)
        # scheme, host and port only: a URL may carry credentials or tokens in its other parts
        shown = f"{url.scheme}://{url.hostname}" + (f":{port}" if port else "")
        checks = [
            ProbeCheck(name="api_key", ok=bool(s.api_key), detail="set" if s.api_key else "unset"),
            ProbeCheck(name="api_url", ok=url_ok, detail=shown if url_ok else "not an http(s) URL"),
            ProbeCheck(name="target", ok=bool(s.target), detail=s.target or "unset"),
        ]
        preflight_ok = all(c.ok for c in checks)
        before = self.circuit.health()
        guidance: list[str] = [] if before["ok"] else [str(before["guidance"])]
        checks.append(
            ProbeCheck(
                name="circuit",
                ok=bool(before["ok"]),
                detail=f"{'closed' if before['ok'] else 'open'} before the probe, "
                f"{self.circuit.failures} consecutive failures",
            )
        )
        if not preflight_ok:
            guidance.append(
                "set DAYTONA_API_KEY, DAYTONA_API_URL (http or https) and DAYTONA_TARGET on the "
                "sandbox broker and restart it"
            )
            return DaytonaProbe(
                ok=False, preflight_ok=False, configured=True, checked_at=utc_now(),
                checks=checks, guidance=guidance, error="preflight failed", replica=s.replica,
            )  # fmt: skip
        query = ListSandboxesQuery(labels={f"{LABEL}/replica": s.replica}, limit=1)
        started = time.monotonic()
        error = ""
        try:
            async with asyncio.timeout(timeout_s):
                async for _ in self.client.list(query):
                    break
        except TimeoutError:
            error = f"Daytona did not answer within {timeout_s:g} s"
        except DaytonaError as exc:
            error = str(translate(exc, "list sandboxes"))
        latency = round((time.monotonic() - started) * 1000, 2)
        self.circuit.record(not error, latency, error)
        checks.append(ProbeCheck(name="api", ok=not error, detail=error or "listed sandboxes"))
        if error:
            guidance.append(
                "Daytona did not answer the probe: check DAYTONA_API_URL is reachable from the "
                "broker, the key's organisation may use DAYTONA_TARGET, and Daytona's status"
            )
        return DaytonaProbe(
            ok=not error, preflight_ok=True, configured=True, checked_at=utc_now(),
            checks=checks, guidance=guidance, latency_ms=latency, error=error,
            replica=s.replica,
        )  # fmt: skip

    async def close(self) -> None:
        close: Callable[[], Awaitable[None]] = self.client.close  # the SDK leaves it unannotated
        await close()
