"""One local sandbox as the broker holds it: its process, its channel, its cells.

Everything the runner sends is untrusted (frames.py); what a frame may ask of the host is
bounded here: a tool call must name an execution in flight on this socket, at most
`max_tool_calls` run at once, and a cell's calls end with it. Wall time is kept by a
`Stopwatch` paused while host calls are pending; a limit hit stops the whole sandbox.
"""

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet_events.envelope import new_id
from fleet_events.sandbox import ExecuteReply, Limits, ToolCall, ToolReply
from fleet_sandbox_broker.domain import Stopwatch
from fleet_sandbox_broker.errors import ForkFailed, ProtocolViolation, SandboxStopped, TooLarge
from fleet_sandbox_broker.providers import frames
from fleet_sandbox_broker.providers.base import OutputSink, ToolRelay
from fleet_sandbox_broker.providers.files import read_in, write_in
from fleet_sandbox_broker.providers.launch import sandbox_env
from fleet_sandbox_broker.providers.tasks import (
    member_group,
    member_tasks,
    move_group,
    move_into,
)
from fleet_sandbox_broker.providers.workspace import (
    copy_sandbox_dir,
    count_entries,
    prepare_child_dirs,
)

if TYPE_CHECKING:
    from fleet_sandbox_broker.providers.local import LocalProvider

log = logging.getLogger("fleet.sandbox.local")

INTERRUPT_TIMEOUT_S = 5.0
# the runner sends a cell's output at most every 100 ms; sandbox code can write `out` frames
# itself, so the broker passes on at most one per OUT_MIN_GAP_S and `output_cap` characters in
# all per cell (the rest of a flood is dropped: the cell's answer still has its output)
OUT_MIN_GAP_S = 0.05


@dataclass
class _Exec:
    future: "asyncio.Future[frames.ExecOutcome]"
    watch: Stopwatch
    relay: ToolRelay
    context: str
    timer: asyncio.TimerHandle | None = None
    calls: set["asyncio.Task[None]"] = field(default_factory=set)
    on_output: OutputSink | None = None
    out_at: float = -1e9  # when the last `out` frame went to the sink (loop time)
    out_chars: int = 0


class LocalSandbox:
    streams_output = True  # `base.StreamsOutput`: a cell's output can be handed over live

    def __init__(
        self,
        provider: "LocalProvider",
        sandbox_id: str,
        uid: int,
        limits: Limits,
        channel: frames.Channel,
        process: "subprocess.Popen[bytes] | None",
    ) -> None:
        self.id = sandbox_id
        self.uid = uid
        self.limits = limits
        self.directory = provider.settings.root / sandbox_id
        self.workspace = self.directory / "workspace"
        self.pid: int | None = None
        self._provider = provider
        self._channel = channel
        self._process = process
        self._execs: dict[str, _Exec] = {}
        self._waiters: dict[str, asyncio.Future[Any]] = {}
        self._reason: str | None = None
        self._limit: str | None = None
        self._reader: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._tool_tasks: set[asyncio.Task[None]] = set()
        self._inode_task: asyncio.Task[None] | None = None
        self._inode_again = False
        self._inode_last = 0.0
        self.contexts: set[str] = set()
        self.on_stop: list[Callable[[Any], Awaitable[None]]] = []
        self.on_full: list[Callable[[Any, str, str], Awaitable[None]]] = []
        """Told (sandbox, "bytes" or "inodes", what to say) when its family's disk fills."""
        self._full: str | None = None
        self.group: Path | None = None
        """Its own pids cgroup (`tasks.member_group`; None: none could be made)."""
        self._binding: asyncio.Task[None] | None = None
        self._disk_task: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()

    # -- state -------------------------------------------------------------------------------

    @property
    def tool_tasks(self) -> set[asyncio.Task[None]]:
        """Host tool calls in flight (each a relay task); empty between cells."""
        return set(self._tool_tasks)

    @property
    def running(self) -> bool:
        return self._reason is None

    @property
    def stopped_reason(self) -> str | None:
        return self._reason

    @property
    def stopped_limit(self) -> str | None:
        return self._limit

    def _check_running(self) -> None:
        if self._reason is not None:
            raise SandboxStopped(f"sandbox {self.id} is stopped: {self._reason}")

    # -- reading -----------------------------------------------------------------------------

    def start_reading(self) -> None:
        self._reader = asyncio.create_task(self._read(), name=f"sandbox-{self.id}")

    async def wait_ready(self, timeout: float) -> int:
        try:
            pid = await asyncio.wait_for(asyncio.shield(self._ready), timeout)
        except TimeoutError:
            await self.stop(f"did not start within {timeout:g} s", "exited")
            raise SandboxStopped(f"sandbox {self.id} did not start within {timeout:g} s") from None
        self.pid = pid
        family = self._provider.disks.family_of(self.directory)
        if family is not None and self._disk_task is None:
            self._disk_task = asyncio.create_task(self._disk_loop(family), name=f"disk-{self.id}")
        return pid

    async def _read(self) -> None:
        reason, limit = "the sandbox process exited", "exited"
        try:
            async for frame in self._channel.frames():
                stop = await self._dispatch(frame)
                if stop is not None:
                    reason, limit = stop
                    break
        except TooLarge as exc:
            reason, limit = f"{exc.message}; the sandbox was stopped", "frame_size"
        except ProtocolViolation as exc:
            reason, limit = f"{exc.message}; the sandbox was stopped", "protocol"
        except Exception as exc:  # never let a sandbox take the broker down
            log.exception("sandbox reader failed", extra={"sandbox": self.id})
            reason, limit = f"broker error reading the sandbox: {exc!r}", "protocol"
        if self._reason is None:
            await self.stop(reason, limit)

    async def _dispatch(self, frame: Any) -> tuple[str, str] | None:
        match frame:
            case frames.Ready():
                # the pid the kernel vouched for, as the host names it (the frame's own is the
                # family's pid namespace's number)
                pid = self._channel.peer_pid
                if pid is None:
                    raise ProtocolViolation("the sandbox's ready frame came without credentials")
                if not self._ready.done():
                    self._ready.set_result(pid)
            case frames.ToolRequest():
                await self._start_tool_call(frame)
            case frames.Output():
                await self._output(frame)
            case frames.Fatal():
                kind = {"cpu": "cpu_time", "memory": "memory"}.get(frame.kind, "exited")
                label = {"cpu_time": "CPU time", "memory": "memory"}.get(kind, frame.kind)
                limit_text = self._limit_text(kind)
                return (
                    f"{label} limit{limit_text} reached ({frame.error}); the sandbox was "
                    "stopped and its REPL state is lost",
                    kind,
                )
            case (
                frames.Ok(req=req)
                | frames.Forked(fork=req)
                | frames.ForkRefused(fork=req)
                | frames.Interrupted(req=req)
            ):
                waiter = self._waiters.pop(req, None)
                if waiter is None:
                    raise ProtocolViolation(f"answer to unknown request {req!r}")
                if not waiter.done():
                    waiter.set_result(frame)
            case _:
                pending = self._execs.pop(frame.exec, None)
                if pending is None:
                    raise ProtocolViolation(f"answer for unknown execution {frame.exec!r}")
                if not pending.future.done():
                    pending.future.set_result(frame)
        return None

    def _limit_text(self, kind: str) -> str:
        if kind == "cpu_time":
            return f" of {self.limits.cpu_s_per_cell} s per cell"
        if kind == "memory":
            return f" of {self.limits.memory_mb} MiB"
        return ""

    async def _output(self, frame: frames.Output) -> None:
        """A streaming cell's output so far, to its sink. One for a cell that has answered
        (the runner's loop sent it just after) or that asked for no stream is dropped, and so
        is one past the rate and size bounds (`OUT_MIN_GAP_S`, `output_cap`); a sink that
        fails is logged and never stops the cell."""
        pending = self._execs.get(frame.exec)
        if pending is None or pending.on_output is None:
            return
        now = asyncio.get_running_loop().time()
        cap = self._provider.settings.output_cap
        if now - pending.out_at < OUT_MIN_GAP_S or pending.out_chars + len(frame.text) > cap:
            return
        pending.out_at = now
        pending.out_chars += len(frame.text)
        try:
            await pending.on_output(frame.text)
        except Exception:
            log.warning("a cell's output sink failed", extra={"sandbox": self.id}, exc_info=True)

    async def _start_tool_call(self, frame: frames.ToolRequest) -> None:
        """A relay task per call, at most `max_tool_calls` at once: sandbox code can write
        `tool` frames itself, so one beyond the bound is refused to the sandbox at once."""
        pending = self._execs.get(frame.exec)
        if pending is None:
            raise ProtocolViolation(f"tool call for unknown execution {frame.exec!r}")
        cap = self._provider.settings.max_tool_calls
        if len(self._tool_tasks) >= cap:
            error = (
                f"host tool {frame.name!r} refused: {len(self._tool_tasks)} host tool calls of "
                f"this sandbox are already in flight (at most {cap} at once)"
            )
            with contextlib.suppress(OSError):
                await self._channel.send(frames.ToolResult(id=frame.id, ok=False, error=error))
            return
        task = asyncio.create_task(self._relay(frame))
        pending.calls.add(task)
        self._tool_tasks.add(task)
        task.add_done_callback(self._tool_tasks.discard)

    async def _relay(self, frame: frames.ToolRequest) -> None:
        pending = self._execs.get(frame.exec)
        if pending is None:
            return
        pending.watch.pause()
        self._arm(pending)
        try:
            reply = await pending.relay(
                ToolCall(
                    request_id=new_id(),
                    sandbox=self.id,
                    context=pending.context,
                    name=frame.name,
                    args=frame.args,
                    kwargs=frame.kwargs,
                )
            )
        except Exception as exc:
            reply = ToolReply(ok=False, error=f"host tool {frame.name!r} failed: {exc}")
        finally:
            pending.watch.resume()
            self._arm(pending)
        with contextlib.suppress(OSError):
            await self._channel.send(
                frames.ToolResult(id=frame.id, ok=reply.ok, value=reply.value, error=reply.error)
            )

    # -- requests ----------------------------------------------------------------------------

    async def _request(self, message: frames.Request, key: str, timeout: float) -> Any:
        self._check_running()
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiters[key] = waiter
        await self._channel.send(message)
        try:
            return await asyncio.wait_for(waiter, timeout)
        finally:
            self._waiters.pop(key, None)

    async def open_context(self, context: str) -> None:
        await self._bound_to_tenant()
        req = new_id()
        await self._request(frames.Open(ctx=context, req=req), req, 10)
        self.contexts.add(context)

    async def close_context(self, context: str) -> None:
        if not self.running:
            self.contexts.discard(context)
            return
        req = new_id()
        await self._request(frames.Close(ctx=context, req=req), req, 10)
        self.contexts.discard(context)

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
    ) -> ExecuteReply:
        """`on_output`: handed what the cell prints while it runs (at most every 100 ms)."""
        self._check_running()
        await self._bound_to_tenant()
        exec_id = new_id()
        loop = asyncio.get_running_loop()
        pending = _Exec(loop.create_future(), Stopwatch(wall_s), relay, context)
        pending.on_output = on_output
        self._execs[exec_id] = pending
        self._watch_inodes()
        await self._channel.send(
            frames.Exec(
                exec=exec_id, ctx=context, code=code, vars=variables, blobs=blobs, tools=tools,
                output_fields=output_fields, stream=on_output is not None,
            )
        )  # fmt: skip
        self._arm(pending)
        try:
            frame = await pending.future
        except SandboxStopped:
            return ExecuteReply(kind="terminal", error=self._reason or "sandbox stopped")
        finally:
            if pending.timer is not None:
                pending.timer.cancel()
            self._execs.pop(exec_id, None)
            for call in pending.calls:  # a cell's host calls end with it
                call.cancel()
            self._watch_inodes()
        return _reply(frame)

    # -- inodes ------------------------------------------------------------------------------

    def _watch_inodes(self) -> None:
        """Count while cells run and once after each; one count at a time, rate-limited.
        A sandbox whose family has a disk quota is not counted: the kernel bounds its inodes
        (`disks`), and `_disk_loop` says when they run out."""
        if not self.running or self._disk_task is not None:
            return
        if self._inode_task is not None and not self._inode_task.done():
            self._inode_again = True
            return
        self._inode_task = asyncio.create_task(self._inode_loop(), name=f"inodes-{self.id}")

    async def _inode_loop(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self._provider.settings.inode_check_s
        while self.running:
            self._inode_again = False
            wait = self._inode_last + interval - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)  # the rate limit between two counts
            self._inode_last = loop.time()
            await self.check_inodes()
            if not (self._execs or self._inode_again):
                return

    async def check_inodes(self) -> int:
        """Files and directories in the workspace and tmp (counting stops past the cap);
        past the cap the sandbox is stopped with limit `inodes`."""
        cap = self._provider.settings.max_inodes
        found = await asyncio.to_thread(
            count_entries, [self.workspace, self.directory / "tmp"], cap
        )
        if found > cap and self.running:
            await self.stop(
                f"inode limit of {cap} files and directories in the workspace and tmp reached; "
                "the sandbox was stopped and its REPL state is lost",
                "inodes",
            )
        return found

    # -- the family's disk ----------------------------------------------------------------------

    async def _disk_loop(self, family: str) -> None:
        """Look at the family's filesystem every `disk_check_s`, cells or not: each time it
        fills (bytes or inodes), the `on_full` hooks are told once; the sandbox keeps running,
        its writes refused `ENOSPC` by the kernel until something is deleted."""
        interval = self._provider.settings.disk_check_s
        while self.running:
            await self.check_disk(family)
            await asyncio.sleep(interval)

    async def check_disk(self, family: str) -> str | None:
        try:
            use = self._provider.disks.use(family)  # one statvfs: no thread hop every 2 s
        except OSError:  # unmounted under it (the family's last directory went)
            return None
        full = use.full
        if full is not None and full != self._full and self.running:
            detail = (
                f"the fork family's disk quota of {self._provider.disks.disk_mb} MiB is full "
                f"({use.bytes_used / (1024 * 1024):.1f} MiB of files)"
                if full == "bytes"
                else f"the fork family's quota of {use.inodes_quota} files and directories is full"
            )
            detail += "; writes fail with ENOSPC until files are deleted, the sandbox runs on"
            for hook in self.on_full:
                try:
                    await hook(self, full, detail)
                except Exception:
                    log.exception("a disk-full hook failed", extra={"sandbox": self.id})
        self._full = full
        return full

    def executing(self, context: str) -> bool:
        return any(p.context == context for p in self._execs.values())

    async def interrupt(self, context: str) -> bool:
        """Stop the cell running in `context`; its reply is an error saying so, and the
        sandbox, its process and its variables stay. False if no cell was running there."""
        running = [key for key, p in self._execs.items() if p.context == context]
        if not running or not self.running:
            return False
        req = new_id()
        try:
            answer = await self._request(
                frames.Interrupt(exec=running[0], ctx=context, req=req), req, INTERRUPT_TIMEOUT_S
            )
        except SandboxStopped:
            return False  # stopped meanwhile (a limit): nothing runs there any more
        except TimeoutError:
            # the runner's main thread never blocks this long: it is wedged, so the cell is
            # stopped the only way left, with its sandbox
            await self.stop(
                f"the sandbox did not answer an interrupt within {INTERRUPT_TIMEOUT_S:g} s; "
                "it was stopped and its REPL state is lost",
                "protocol",
            )
            return True
        return bool(answer.running)

    def _arm(self, pending: _Exec) -> None:
        """(Re)schedule the wall-time check: none while a host callback is pending."""
        if pending.timer is not None:
            pending.timer.cancel()
            pending.timer = None
        if pending.watch.paused or pending.future.done():
            return
        loop = asyncio.get_running_loop()
        pending.timer = loop.call_later(max(0.0, pending.watch.remaining()), self._expire, pending)

    def _expire(self, pending: _Exec) -> None:
        pending.timer = None
        if pending.future.done() or pending.watch.paused:
            return
        if pending.watch.remaining() > 0:
            self._arm(pending)
            return
        reason = (
            f"execution exceeded the {pending.watch.budget_s:g} s wall-time limit (time waiting "
            "on host tools not counted); the sandbox was stopped and its REPL state is lost"
        )
        task = asyncio.get_running_loop().create_task(self.stop(reason, "wall_time"))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- fork --------------------------------------------------------------------------------

    async def fork_into(self, child_id: str) -> "LocalSandbox":
        self._check_running()
        await self._bound_to_tenant()  # the fork is made under its parent's tenant
        provider = self._provider
        # the member joins before its process exists: a full family refuses the fork here,
        # before the process limit would (docs/sandboxes.md, "Fork families")
        provider.family_reserve(self.uid, self.id)
        made: list[LocalSandbox] = []
        try:
            return await self._fork_reserved(child_id, made)
        except BaseException:
            # a child that came up left the family as it stopped (`_stop`); the place of one
            # that never did is given back here
            if not made or made[0].pid is None:
                await provider.family_leave(self.uid)
            raise

    async def _fork_reserved(self, child_id: str, made: list["LocalSandbox"]) -> "LocalSandbox":
        provider = self._provider
        child_dir = provider.settings.root / child_id
        await asyncio.to_thread(provider.record_uid, self.uid, child_dir)
        family = provider.disks.family_of(self.directory)
        if family is not None:  # in the family's filesystem: its quota covers the fork too
            await asyncio.to_thread(provider.disks.place, family, child_id)
        await asyncio.to_thread(prepare_child_dirs, child_dir, self.uid, family is not None)
        copy: asyncio.Task[None] | None = None
        bounding: asyncio.Task[None] | None = None
        mine, theirs = socket.socketpair()
        child = LocalSandbox(
            provider,
            child_id,
            self.uid,
            self.limits,
            frames.Channel(mine, provider.settings.max_frame),
            None,
        )
        made.append(child)
        key = new_id()
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiters[key] = waiter
        try:
            child.start_reading()
            await self._channel.send(
                frames.Fork(fork=key, cwd=str(child.workspace), env=sandbox_env(child.directory)),
                (theirs.fileno(),),
            )
            theirs.close()
            answer = await asyncio.wait_for(waiter, 10)
            if isinstance(answer, frames.ForkRefused):
                raise ForkFailed(f"cannot fork sandbox {self.id}: {answer.error}")
            # the child idles until asked: its files are copied while it comes up, and only
            # for a fork that happened
            copy = asyncio.create_task(copy_sandbox_dir(self.directory, child_dir, self.uid))
            pid = await child.wait_ready(10)
            if owned_by(pid, self.uid):  # its own cgroup while the copy runs (a migration
                # costs milliseconds in cgroup v1: off the fork's path where it can be)
                bounding = asyncio.create_task(child._bound_own_tasks(pid, self))
            await copy
            if bounding is not None:
                await bounding
        except BaseException:
            theirs.close()
            if copy is not None and not copy.done():
                copy.cancel()
            self._waiters.pop(key, None)
            await child.stop("fork failed", "exited")
            await asyncio.to_thread(provider.disks.remove, child_dir)
            raise
        if not owned_by(pid, self.uid):
            await child.stop("the forked child reported a process that is not its own", "protocol")
            raise ForkFailed(f"fork of sandbox {self.id} failed: the child misreported itself")
        child.contexts = set(self.contexts)
        return child

    async def _bound_own_tasks(self, pid: int, parent: "LocalSandbox") -> None:
        """A fork starts in its parent's cgroup (it was made inside the parent): moved into
        one of its own, beside its parent's (under the same tenant's), while it idles; its
        bomb stops at its own bound (`tasks`)."""
        provider = self._provider
        under = parent.group.parent if parent.group is not None else None
        own = await asyncio.to_thread(
            member_group, provider.tasks, self.id, member_tasks(self.limits.nproc), under
        )
        if own is None:
            return
        if not await asyncio.to_thread(move_into, own, pid):
            log.warning("a fork stays in its parent's task bound", extra={"sandbox": self.id})
        self.group = own.parent

    async def bind_tenant(self, tenant: str) -> None:
        """Put the sandbox's own cgroup under its tenant's (`tasks.tenant_group`): a pooled or
        revived sandbox started under the host's alone. Begun here and finished before the
        sandbox runs anything of the tenant's (its first context, cell or fork waits on it):
        moving a threaded process costs an RCU grace period in cgroup v1, ~10 ms here, which
        a hand-out need not wait for. Never raises: a sandbox that cannot be moved stays
        bounded by its own and the host's bounds."""
        if self.group is None or not self.running or self._binding is not None:
            return
        self._binding = asyncio.create_task(self._bind(tenant), name=f"tenant-{self.id}")

    async def _bound_to_tenant(self) -> None:
        if self._binding is not None and not self._binding.done():
            await asyncio.shield(self._binding)

    async def _bind(self, tenant: str) -> None:
        provider = self._provider
        assert self.group is not None
        try:
            tenant_dir = await asyncio.to_thread(provider.tenant_group, tenant)
            if tenant_dir is None or self.group.parent == tenant_dir:
                return
            own = await asyncio.to_thread(
                member_group, provider.tasks, self.id, member_tasks(self.limits.nproc),
                tenant_dir,
            )  # fmt: skip
            if own is None:
                return
            if not await asyncio.to_thread(move_group, self.group, own.parent):
                log.warning("a sandbox stays outside its tenant's task bound",
                            extra={"sandbox": self.id})  # fmt: skip
            self.group = own.parent
        except OSError:
            log.exception("could not bound a sandbox's tasks by its tenant's",
                          extra={"sandbox": self.id})  # fmt: skip

    # -- files -------------------------------------------------------------------------------

    async def write_file(self, path: str, data: bytes) -> None:
        self._provider.disks.reach(self.directory)
        await asyncio.to_thread(write_in, self.workspace, path, data, self.uid)

    async def read_file(self, path: str, max_bytes: int) -> bytes:
        self._provider.disks.reach(self.directory)
        return await asyncio.to_thread(read_in, self.workspace, path, max_bytes)

    # -- ending ------------------------------------------------------------------------------

    async def stop(self, reason: str, limit: str = "exited") -> None:
        """Idempotent; a second caller waits until the first stop (hooks included) is done,
        so a delete racing a limit records the limit first."""
        if self._reason is not None:
            await self._stopped.wait()
            return
        try:
            await self._stop(reason, limit)
        finally:
            self._stopped.set()

    async def _stop(self, reason: str, limit: str) -> None:
        self._reason = reason
        self._limit = limit
        self._kill_group()
        if self._reader is not None and self._reader is not asyncio.current_task():
            self._reader.cancel()
        if self._inode_task is not None and self._inode_task is not asyncio.current_task():
            self._inode_task.cancel()
        if self._disk_task is not None and self._disk_task is not asyncio.current_task():
            self._disk_task.cancel()
        self._channel.close()
        if not self._ready.done():
            self._ready.set_exception(SandboxStopped(reason))
            self._ready.exception()
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_exception(SandboxStopped(reason))
                waiter.exception()
        for pending in self._execs.values():
            if not pending.future.done():
                pending.future.set_exception(SandboxStopped(reason))
                pending.future.exception()
        if self.pid is not None:
            # the family's last member takes its pid namespace with it (local.py)
            await self._provider.family_leave(self.uid)
        self._provider.drop_member_later(self.group)
        for hook in self.on_stop:
            await hook(self)

    def _kill_group(self) -> None:
        pid = self.pid if self.pid is not None else (self._process.pid if self._process else None)
        if pid is None or not owned_by(pid, self.uid):
            if self._process is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._process.pid, signal.SIGKILL)
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)

    async def destroy(self) -> None:
        await self.stop("deleted", "exited")
        await asyncio.to_thread(self._provider.disks.remove, self.directory)


def _reply(frame: frames.ExecOutcome) -> ExecuteReply:
    match frame:
        case frames.Result():
            return ExecuteReply(kind="result", value=frame.value, stdout=frame.stdout)
        case frames.Final():
            return ExecuteReply(kind="final", value=frame.value, stdout=frame.stdout)
        case frames.SyntaxFailure():
            return ExecuteReply(kind="syntax", error=frame.error, stdout=frame.stdout)
        case frames.ExecFailure():
            return ExecuteReply(kind="error", error=frame.error, stdout=frame.stdout)
        case frames.Missing():
            return ExecuteReply(kind="missing", missing=frame.hashes)
    raise ProtocolViolation(f"unexpected frame {frame!r}")


def owned_by(pid: int, uid: int) -> bool:
    try:
        return os.stat(f"/proc/{pid}").st_uid == uid
    except OSError:
        return False
