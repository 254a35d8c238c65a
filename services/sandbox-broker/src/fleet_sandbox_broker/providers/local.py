"""The `local` provider: each sandbox is a Python process on this host, contained.

Launch (the broker runs as root; see docs/sandboxes.md):

    unshare --net --mount -- /bin/sh setup.sh <root> \
        setpriv --reuid=U --regid=U --clear-groups --no-new-privs --bounding-set=-all \
        /usr/bin/python3 -I <root>/<id>/runner.py

- its own network namespace: no interface but a down loopback, so NATS, the LLM server and
  the outside are unreachable;
- its own mount namespace (setup.sh): /tmp, /var/tmp, /dev/shm and /run/lock are empty
  read-only tmpfs; the sandbox root is bound back at its own path so its workspace resolves;
- a uid of its own (one per fork family, from a pool), no groups, no capabilities, no way to
  regain privileges; the workspace is mode 700, so sandboxes cannot read each other;
- an environment built from nothing (PATH, HOME, TMPDIR, LANG, MALLOC_ARENA_MAX);
- rlimits set by the runner before any user code: address space, CPU (per cell, soft; per
  sandbox, hard), processes of its uid, file size, open files, no core dumps.
"""

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_events.envelope import new_id
from fleet_events.sandbox import Capabilities, ExecuteReply, Limits, ToolCall, ToolReply
from fleet_sandbox_broker.domain import Stopwatch
from fleet_sandbox_broker.errors import (
    BadSpec,
    ForkFailed,
    ProtocolViolation,
    SandboxStopped,
    TooLarge,
)
from fleet_sandbox_broker.providers import frames
from fleet_sandbox_broker.providers.base import Provider, Sandbox, ToolRelay
from fleet_sandbox_broker.providers.files import read_in, write_in
from fleet_sandbox_broker.providers.git import check_ref, check_repo_url
from fleet_sandbox_broker.providers.uids import UidPool, chown_tree

log = logging.getLogger("fleet.sandbox.local")

RUNNER = Path(__file__).with_name("runner.py")

# The sandbox's root filesystem, built by allow-list in its own mount namespace: a tmpfs over
# /tmp (private to the namespace) becomes `/`, holding only SHOW (directories bound, links
# copied), the ETC files under /etc, /proc, a minimal /dev, an empty /tmp and the sandbox
# root at its own path (so roots under /tmp, as in tests, still resolve), mounted nosuid and
# nodev; then pivot_root into it and return to the workspace (the cwd it was started in).
# Args: $1 root, $2 SHOW, $3 ETC, $4 HIDE, volume binds
# (source target) up to "--", then the command.
SETUP_SH = """set -e
R="$1"; SHOW="$2"; ETC="$3"; HIDE="$4"; shift 4
W="$(pwd)"
while [ "$1" != "--" ]; do
  mount --no-canonicalize --bind "$1" "$2"
  mount --no-canonicalize -o remount,bind,nosuid,nodev "$2"
  shift 2
done
shift
exec 8<"$R"
N=/tmp
mount -t tmpfs -o size=1m,mode=755,nosuid,nodev tmpfs "$N"
copy() {
  if [ -L "$1" ]; then ln -s "$(readlink "$1")" "$N$1"
  elif [ -d "$1" ]; then mkdir -p "$N$1"; mount --rbind "$1" "$N$1"
  elif [ -e "$1" ]; then : > "$N$1"; mount --bind "$1" "$N$1"
  fi
}
for d in $SHOW; do copy "$d"; done
mkdir -p "$N/etc" "$N/proc" "$N/dev" "$N/tmp"
for f in $ETC; do copy "/etc/$f"; done
mount --rbind /proc "$N/proc"
mount -t tmpfs -o size=16k,mode=755,nosuid,noexec tmpfs "$N/dev"
for f in null zero full random urandom; do copy "/dev/$f"; done
ln -s /proc/self/fd "$N/dev/fd"
ln -s /proc/self/fd/0 "$N/dev/stdin"
ln -s /proc/self/fd/1 "$N/dev/stdout"
ln -s /proc/self/fd/2 "$N/dev/stderr"
mount -o remount,ro,bind "$N/dev"
mkdir -p "$N$R"
mount --no-canonicalize --rbind /proc/self/fd/8 "$N$R"
exec 8<&-
mount --no-canonicalize -o remount,bind,nosuid,nodev "$N$R"
for h in $HIDE; do
  case "$R/" in "$h"/*) continue ;; esac
  if [ -d "$N$h" ] && [ ! -L "$N$h" ]; then mount -t tmpfs -o ro,size=4k tmpfs "$N$h"; fi
done
cd "$N"
PATH="/usr/sbin:/sbin:$PATH" pivot_root . .
umount -l .
mount -o remount,ro,bind /
cd "$W"
unset OLDPWD
exec "$@"
"""

# What a sandbox sees of the host: Python and the tools it runs need these, nothing else.
SHOW = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC = (
    "passwd", "group", "nsswitch.conf", "ld.so.cache", "ld.so.conf", "ld.so.conf.d",
    "localtime", "timezone", "mime.types", "protocols", "services", "hosts", "host.conf",
    "os-release", "alternatives", "python3", "python3.11", "python3.12", "python3.13",
)  # fmt: skip

# Clones into a sandbox's workspace as its uid. $1 workspace, $2 a bundle of a local source
# or "", $3 uid, $4 URL, $5 ref (already checked: never an option). The workspace and the
# bundle are opened before /tmp is covered, then shown at /tmp/ws and /tmp/src.bundle.
# `checkout` takes the ref as a positional: git 2.39's checkout reads `--end-of-options` as a
# second ref, so what keeps a ref from being an option is `check_ref` (no leading '-').
CLONE_SH = """set -e
WS="$1"; BUNDLE="$2"; U="$3"; URL="$4"; REF="$5"
exec 8<"$WS"
if [ -n "$BUNDLE" ]; then exec 9<"$BUNDLE"; fi
mount -t tmpfs -o size=64k,mode=755 tmpfs /tmp
mkdir /tmp/ws
mount --bind /proc/self/fd/8 /tmp/ws
if [ -n "$BUNDLE" ]; then
  : > /tmp/src.bundle
  mount --bind /proc/self/fd/9 /tmp/src.bundle
  URL=/tmp/src.bundle
  exec 9<&-
fi
exec 8<&-
as_uid() {
  setpriv --reuid="$U" --regid="$U" --clear-groups --no-new-privs --bounding-set=-all \\
    --inh-caps=-all "$@"
}
cd /tmp/ws
as_uid git clone --quiet --no-checkout -- "$URL" /tmp/ws/repo
as_uid git -C /tmp/ws/repo checkout --quiet "$REF" --
"""
GIT_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "GIT_TERMINAL_PROMPT": "0",
           "GIT_CONFIG_NOSYSTEM": "1", "LANG": "C"}  # fmt: skip
CLONE_TIMEOUT_S = 300
INTERRUPT_TIMEOUT_S = 5.0

HIDE: tuple[str, ...] = ()  # the allow-list shows none of /home, /root, /work, /run, /var ...

CAPABILITIES = Capabilities(
    fork=True,
    fork_keeps_repl_memory=True,
    durable_volumes=True,
    network_isolation=True,
    archive=False,
)


@dataclass(frozen=True)
class LocalSettings:
    root: Path
    python: str = "/usr/bin/python3"
    uid_base: int = 310000
    uid_count: int = 4096
    max_frame: int = 4 * 1024 * 1024
    output_cap: int = 1024 * 1024
    start_timeout_s: float = 15.0
    uid_locks: Path = Path("/run/fleet-rlm/sandbox-uids")
    # host paths a sandbox sees (an allow-list; /etc only the ETC entries)
    show: tuple[str, ...] = SHOW
    # covered by an empty read-only tmpfs even where `show` would expose them (a directory
    # under /usr holding something private); none of the defaults exist inside a sandbox
    hide: tuple[str, ...] = HIDE
    # host tool calls in flight at once per sandbox; more are refused to the sandbox at once
    # (its code can write `tool` frames of its own, each would be a relay on the host)
    max_tool_calls: int = 8
    # files and directories a sandbox's workspace and tmp may hold (no quota on the host's
    # filesystems: counted while cells run, at most every `inode_check_s`, and after each)
    max_inodes: int = 100_000
    inode_check_s: float = 1.0


@dataclass
class _Exec:
    future: "asyncio.Future[frames.ExecOutcome]"
    watch: Stopwatch
    relay: ToolRelay
    context: str
    timer: asyncio.TimerHandle | None = None
    calls: set["asyncio.Task[None]"] = field(default_factory=set)


class LocalSandbox:
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
            if limit == "exited" and self._process is not None:
                code = await asyncio.to_thread(self._wait_exit)
                if code is not None and code < 0:
                    reason = f"the sandbox process was killed by signal {-code}"
            await self.stop(reason, limit)

    def _wait_exit(self) -> int | None:
        assert self._process is not None
        try:
            return self._process.wait(2)
        except subprocess.TimeoutExpired:
            return None

    async def _dispatch(self, frame: Any) -> tuple[str, str] | None:
        match frame:
            case frames.Ready(pid=pid):
                if not self._ready.done():
                    self._ready.set_result(pid)
            case frames.ToolRequest():
                await self._start_tool_call(frame)
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
    ) -> ExecuteReply:
        self._check_running()
        exec_id = new_id()
        loop = asyncio.get_running_loop()
        pending = _Exec(loop.create_future(), Stopwatch(wall_s), relay, context)
        self._execs[exec_id] = pending
        self._watch_inodes()
        await self._channel.send(
            frames.Exec(
                exec=exec_id, ctx=context, code=code, vars=variables, blobs=blobs, tools=tools,
                output_fields=output_fields,
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
        """Count while cells run and once after each; one count at a time, rate-limited."""
        if not self.running:
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

    def executing(self, context: str) -> bool:
        return any(p.context == context for p in self._execs.values())

    async def interrupt(self, context: str) -> bool:
        """Stop the cell running in `context`; its reply is an error saying so, and the
        sandbox, its process and its variables stay. False if no cell was running there."""
        running = [key for key, p in self._execs.items() if p.context == context]
        if not running or not self.running:
            return False
        req = new_id()
        answer = await self._request(
            frames.Interrupt(exec=running[0], ctx=context, req=req), req, INTERRUPT_TIMEOUT_S
        )
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
        provider = self._provider
        child_dir = provider.settings.root / child_id
        await asyncio.to_thread(provider.record_uid, self.uid, child_dir)
        await asyncio.to_thread(provider.prepare_child_dirs, child_dir, self.uid)
        copy: asyncio.Task[None] | None = None
        mine, theirs = socket.socketpair()
        child = LocalSandbox(
            provider,
            child_id,
            self.uid,
            self.limits,
            frames.Channel(mine, provider.settings.max_frame),
            None,
        )
        key = new_id()
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiters[key] = waiter
        try:
            child.start_reading()
            await self._channel.send(
                frames.Fork(fork=key, cwd=str(child.workspace), env=_env_for(child.directory)),
                (theirs.fileno(),),
            )
            theirs.close()
            answer = await asyncio.wait_for(waiter, 10)
            if isinstance(answer, frames.ForkRefused):
                raise ForkFailed(f"cannot fork sandbox {self.id}: {answer.error}")
            # the child idles until asked: its files are copied while it comes up, and only
            # for a fork that happened
            copy = asyncio.create_task(
                provider.copy_sandbox_dir(self.directory, child_dir, self.uid)
            )
            pid = await child.wait_ready(10)
            await copy
        except BaseException:
            theirs.close()
            if copy is not None and not copy.done():
                copy.cancel()
            self._waiters.pop(key, None)
            await child.stop("fork failed", "exited")
            await provider.remove_dir(child_dir)
            raise
        if not _owned_by(pid, self.uid):
            await child.stop("the forked child reported a process that is not its own", "protocol")
            raise ForkFailed(f"fork of sandbox {self.id} failed: the child misreported itself")
        provider.family_join(self.uid)
        child.contexts = set(self.contexts)
        return child

    # -- files -------------------------------------------------------------------------------

    async def write_file(self, path: str, data: bytes) -> None:
        await asyncio.to_thread(write_in, self.workspace, path, data, self.uid)

    async def read_file(self, path: str, max_bytes: int) -> bytes:
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
        if self._process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(self._process.wait, 5)
        if self.pid is not None:
            await self._provider.family_leave(self.uid)
        for hook in self.on_stop:
            await hook(self)

    def _kill_group(self) -> None:
        pid = self.pid if self.pid is not None else (self._process.pid if self._process else None)
        if pid is None or not _owned_by(pid, self.uid):
            if self._process is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._process.pid, signal.SIGKILL)
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)

    async def destroy(self) -> None:
        await self.stop("deleted", "exited")
        await self._provider.remove_dir(self.directory)


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


def count_entries(tops: list[Path], cap: int) -> int:
    """Entries under `tops`, never following a link, stopping once past `cap`. The tree is
    the sandbox's: entries vanishing or swapped mid-walk are skipped, never followed."""
    found = 0
    stack = [str(top) for top in tops]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    found += 1
                    if found > cap:
                        return found
                    with contextlib.suppress(OSError):
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
        except OSError:
            continue
    return found


def _owned_by(pid: int, uid: int) -> bool:
    try:
        return os.stat(f"/proc/{pid}").st_uid == uid
    except OSError:
        return False


def _env_for(directory: Path) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(directory / "workspace"),
        "TMPDIR": str(directory / "tmp"),
        "LANG": "C.UTF-8",
        "MALLOC_ARENA_MAX": "2",
    }


class LocalProvider:
    name = "local"
    capabilities = CAPABILITIES

    def __init__(self, settings: LocalSettings) -> None:
        self.settings = settings
        root = settings.root
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o711)  # noqa: S103 - traversable, not listable: each sandbox is 700
        private = root / ".broker"
        private.mkdir(exist_ok=True)
        os.chmod(private, 0o700)
        self._setup = private / "setup.sh"
        self._setup.write_text(SETUP_SH)
        # host-wide, whatever the root: two brokers on one host must never share a uid (a
        # claim sweeps the uid's processes)
        settings.uid_locks.mkdir(parents=True, exist_ok=True, mode=0o700)
        (private / "logs").mkdir(exist_ok=True)
        self._logs = private / "logs"
        self._uids = UidPool(settings.uid_locks, settings.uid_base, settings.uid_count)
        self._uids.record_leftovers(root)
        self._families: dict[int, int] = {}

    def family_join(self, uid: int) -> None:
        self._families[uid] = self._families.get(uid, 0) + 1

    async def family_leave(self, uid: int) -> None:
        left = self._families.get(uid, 0) - 1
        if left > 0:
            self._families[uid] = left
            return
        self._families.pop(uid, None)
        await asyncio.to_thread(self._uids.release, uid)  # the sweep runs a process

    async def create(
        self,
        sandbox_id: str,
        limits: Limits,
        *,
        fork_ready: bool = True,
        mounts: dict[str, Path] | None = None,
        revive: bool = False,
    ) -> LocalSandbox:
        """Start a sandbox. `mounts` binds host directories (volumes) at workspace-relative
        paths; `revive` starts a new process in an existing sandbox's directory (files kept,
        REPL memory gone), after a broker restart."""
        uid = await asyncio.to_thread(self._uids.claim, self.settings.root / sandbox_id)
        try:
            directory = await asyncio.to_thread(
                self._make_dirs, sandbox_id, uid, list(mounts or {}), revive
            )
            binds: list[str] = []
            for target, source in (mounts or {}).items():
                binds += [str(source), str(directory / "workspace" / target)]
            mine, theirs = socket.socketpair()
            argv = [
                "unshare", "--net", "--mount", "--", "/bin/sh", str(self._setup),
                str(self.settings.root), " ".join(self.settings.show), " ".join(ETC),
                " ".join(self.settings.hide), *binds, "--",
                "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                "--no-new-privs", "--bounding-set=-all", "--inh-caps=-all",
                self.settings.python, "-I", str(directory / "runner.py"),
            ]  # fmt: skip
            process = await asyncio.to_thread(self._spawn, argv, theirs, directory, sandbox_id)
            theirs.close()
        except BaseException:
            await asyncio.to_thread(self._uids.release, uid)
            raise
        self.family_join(uid)
        sandbox = LocalSandbox(
            self, sandbox_id, uid, limits, frames.Channel(mine, self.settings.max_frame), process
        )
        sandbox.start_reading()
        mb = 1024 * 1024
        try:
            await sandbox._channel.send(
                frames.Init(
                    limits={
                        "RLIMIT_AS": limits.memory_mb * mb,
                        "RLIMIT_CPU": limits.cpu_s_total,
                        "RLIMIT_NPROC": limits.nproc,
                        "RLIMIT_FSIZE": limits.file_mb * mb,
                        "RLIMIT_NOFILE": limits.open_files,
                        "RLIMIT_CORE": 0,
                    },
                    cell_cpu_s=limits.cpu_s_per_cell,
                    checkpoints=fork_ready,
                    output_cap=self.settings.output_cap,
                    max_frame=self.settings.max_frame,
                    max_in=256 * mb,
                )
            )
            await sandbox.wait_ready(self.settings.start_timeout_s)
        except BaseException:
            await sandbox.stop("failed to start", "exited")
            raise
        return sandbox

    async def fork(self, parent: LocalSandbox, child_id: str) -> LocalSandbox:
        return await parent.fork_into(child_id)

    def _spawn(
        self, argv: list[str], channel: socket.socket, directory: Path, sandbox_id: str
    ) -> "subprocess.Popen[bytes]":
        with open(self._logs / f"{sandbox_id}.log", "ab") as err:
            return subprocess.Popen(
                argv,
                stdin=channel.fileno(),
                stdout=subprocess.DEVNULL,
                stderr=err,
                cwd=directory / "workspace",
                env=_env_for(directory),
                start_new_session=True,
                close_fds=True,
            )

    def _make_dirs(self, sandbox_id: str, uid: int, mountpoints: list[str], revive: bool) -> Path:
        directory = self.settings.root / sandbox_id
        directory.mkdir(mode=0o700, exist_ok=revive)
        for sub in ("workspace", "tmp"):
            (directory / sub).mkdir(mode=0o700, exist_ok=revive)
        for target in mountpoints:
            (directory / "workspace" / target).mkdir(mode=0o700, parents=True, exist_ok=True)
        chown_tree(directory / "workspace", uid)
        chown_tree(directory / "tmp", uid)
        with contextlib.suppress(FileNotFoundError):
            os.chmod(directory / "runner.py", 0o600)
        shutil.copyfile(RUNNER, directory / "runner.py")
        os.chmod(directory / "runner.py", 0o444)
        # root-owned and traversable only: the sandbox writes nowhere but workspace/ and tmp/
        os.chmod(directory, 0o711)  # noqa: S103
        return directory

    async def clone_repo(
        self, box: LocalSandbox, url: str, ref: str | None, *, allow_local: bool
    ) -> None:
        """Clone `url` at `ref` into `workspace/repo` AS THE SANDBOX'S UID, on the host network
        (the sandbox has none) but in a mount namespace of its own that shows git the
        workspace at a neutral path (the host path above the sandboxes may be closed to it).
        The uid is fresh here (nothing of it runs user code yet), and git writes nowhere that
        uid could not write itself. A local source (tests only) is bundled by root first, so
        the uid never needs to read a host path. git's stderr is logged here, never returned:
        it can quote what git read."""
        url = check_repo_url(url, allow_local=allow_local)
        checked_ref = check_ref(ref) or "HEAD"
        shown = f"cannot check out {url!r} at {checked_ref!r}"
        staging: Path | None = None
        try:
            bundle = ""
            if "://" not in url or url.startswith("file:"):
                staging = self.settings.root / ".broker" / "clones" / new_id()
                bundle = await self._bundle(url, staging, shown)
            argv = ["unshare", "--mount", "--", "/bin/sh", "-c", CLONE_SH, "clone",
                    str(box.workspace), bundle, str(box.uid), url, checked_ref]  # fmt: skip
            protocols = "https:ssh:git" + (":file" if allow_local else "")
            detail = await _git(argv, {**GIT_ENV, "GIT_ALLOW_PROTOCOL": protocols}, shown)
        finally:
            if staging is not None:
                await self.remove_dir(staging)
        if detail is not None:
            log.warning("git clone failed", extra={"sandbox": box.id, "stderr": detail})
            raise BadSpec(f"{shown}: the repository or ref was not found or is unreachable")

    async def _bundle(self, source: str, staging: Path, shown: str) -> str:
        path = source.removeprefix("file://")
        await asyncio.to_thread(staging.mkdir, 0o700, True)
        target = staging / "source.bundle"
        argv = ["git", "-C", path, "bundle", "create", "--quiet", str(target), "--all"]
        detail = await _git(argv, GIT_ENV, shown)
        if detail is not None:
            log.warning("git bundle failed", extra={"stderr": detail})
            raise BadSpec(f"{shown}: the repository or ref was not found or is unreachable")
        os.chmod(target, 0o444)
        return str(target)

    def record_uid(self, uid: int, directory: Path) -> None:
        self._uids.record(uid, directory)

    def prepare_child_dirs(self, directory: Path, uid: int) -> None:
        """What a forked child needs before it starts: its workspace and tmp, empty."""
        directory.mkdir(mode=0o711)
        for sub in ("workspace", "tmp"):
            (directory / sub).mkdir(mode=0o700)
            os.chown(directory / sub, uid, uid)

    async def copy_sandbox_dir(self, source: Path, target: Path, uid: int) -> None:
        """Merge `source`'s workspace and tmp into the prepared `target` (modes kept, reflinks
        if the filesystem has them), AS THE SANDBOX'S UID: the target is writable by that uid
        (and so by its family's code), which may plant links there; run as the uid, a copy
        that follows one can only write where the sandbox could already write itself."""
        for sub in ("workspace", "tmp"):
            # both named by fd: the uid need not traverse the host path above the sandboxes,
            # and root-owned 0711 parents keep `workspace` and `tmp` from being swapped
            fds = [_open_dir(source / sub), _open_dir(target / sub)]
            try:
                proc = await asyncio.create_subprocess_exec(
                    "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                    "--no-new-privs", "--bounding-set=-all",
                    "cp", "-a", "--reflink=auto", "-T", *(f"/proc/self/fd/{fd}/" for fd in fds),
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, pass_fds=fds,
                    env={"PATH": "/usr/bin:/bin"},
                )  # fmt: skip
            finally:
                for fd in fds:
                    os.close(fd)
            _, err = await proc.communicate()
            if proc.returncode != 0:
                raise ForkFailed(f"copying the workspace failed: {err.decode(errors='replace')}")
        await asyncio.to_thread(_install_runner, target)

    async def remove_dir(self, directory: Path) -> None:
        await asyncio.to_thread(shutil.rmtree, directory, True)

    async def discard(self, sandbox_id: str) -> None:
        await self.remove_dir(self.settings.root / sandbox_id)

    async def close(self) -> None:
        pass


async def _git(argv: list[str], env: dict[str, str], shown: str) -> str | None:
    """Run a git step; None if it worked, else its stderr (for the log only)."""
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    try:
        _, err = await asyncio.wait_for(proc.communicate(), CLONE_TIMEOUT_S)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        raise BadSpec(f"{shown}: it took over {CLONE_TIMEOUT_S} s") from None
    if proc.returncode != 0:
        return err.decode(errors="replace").strip()[-4000:]
    return None


def _open_dir(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)


def _install_runner(directory: Path) -> None:
    """runner.py in a root-owned directory only root writes to (0711)."""
    shutil.copyfile(RUNNER, directory / "runner.py")
    os.chmod(directory / "runner.py", 0o444)


def _keeps_the_contract(provider: LocalProvider, sandbox: LocalSandbox) -> tuple[Provider, Sandbox]:
    """Never called: mypy checks here that `local` implements the provider contract."""
    return provider, sandbox
