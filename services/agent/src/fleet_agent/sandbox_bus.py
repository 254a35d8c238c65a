"""The agent's line to the sandbox broker, usable from synchronous dspy code.

dspy calls interpreters synchronously, from any thread, sometimes from inside a running event
loop (`aforward`), and a tool may build a nested interpreter while an outer `execute` is
blocked. So the bus owns one event loop in a daemon thread with its own NATS connection; every
call is submitted to it and waited for from the caller's thread, and every tool callback runs
in a thread of its own, never on the loop (a tool may itself call the bus).
"""

import asyncio
import concurrent.futures
import contextlib
import queue
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from fleet_agent.run.failures import RunBroke
from fleet_events import bus as verbs
from fleet_events import sandbox as sb
from fleet_events.bus import Verb
from fleet_events.envelope import BlobRef, new_id
from fleet_mesh import rpc
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.connection import connect

T = TypeVar("T")
Req = TypeVar("Req")
ToolHandler = Callable[[sb.ToolCall], sb.ToolReply]

_encoder = msgspec.json.Encoder()
_tool_calls = msgspec.json.Decoder(verbs.TOOL_CALL.request)
_cell_output = msgspec.json.Decoder(sb.CellOutput)


class BusClosed(RunBroke, RuntimeError):
    """The bus a run talks to the mesh on is closed (its replica is stopping)."""


class SandboxBus:
    def __init__(self, url: str, *, tenant: str, name: str = "agent-interpreters") -> None:
        self.url = url
        self.tenant = tenant
        self._name = name
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name=name)
        self._nc: Client | None = None
        self._blobs: JetStreamBlobs | None = None
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> "SandboxBus":
        self._thread.start()
        self._nc = self.run(connect(self.url, name=self._name), timeout=timeout)
        return self

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._nc is not None:
            with contextlib.suppress(Exception):
                self.run(self._nc.drain(), timeout=5, allow_closed=True)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> "SandboxBus":
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- calls -------------------------------------------------------------------------------

    def run(self, work: Coroutine[Any, Any, T], *, timeout: float, allow_closed: bool = False) -> T:
        return self.submit(work, allow_closed=allow_closed).result(timeout)

    def submit(
        self, work: Coroutine[Any, Any, T], *, allow_closed: bool = False
    ) -> "concurrent.futures.Future[T]":
        """Start `work` on the bus loop; the caller waits on the future as it sees fit."""
        if self._closed and not allow_closed:
            work.close()
            raise BusClosed("the sandbox bus is closed")
        if threading.current_thread() is self._thread:
            work.close()
            raise RuntimeError("SandboxBus.run called on its own loop: that would deadlock")
        return asyncio.run_coroutine_threadsafe(work, self._loop)

    @property
    def nc(self) -> Client:
        if self._nc is None:
            raise BusClosed("the sandbox bus is not started")
        return self._nc

    def call(
        self,
        verb: Verb[Req, T],
        request: Req,
        *,
        timeout: float,
        target: str | None = None,
        reach_s: float = 0.0,
    ) -> T:
        """One request; with `reach_s`, resent while "no responders" answers it, for up to
        that long (`rpc.call_reaching`: the service is reconnecting after a NATS restart)."""
        call = rpc.call_verb_reaching(
            self.nc, verb, request, timeout=timeout, target=target, reach_s=reach_s
        )
        return self.run(call, timeout=timeout + reach_s + 5)

    # -- broker conveniences -----------------------------------------------------------------

    def create_sandbox(
        self,
        *,
        labels: dict[str, str] | None = None,
        limits: sb.Limits | None = None,
        fork_ready: bool = True,
        timeout: float = 30.0,
    ) -> sb.SandboxInfo:
        request = sb.CreateSandbox(
            request_id=new_id(),
            tenant=self.tenant,
            labels=labels or {},
            limits=limits,
            fork_ready=fork_ready,
        )
        return self.call(verbs.CREATE_SANDBOX, request, timeout=timeout)

    def fork_sandbox(self, sandbox: str, *, timeout: float = 30.0) -> sb.SandboxInfo:
        request = sb.ForkSandbox(request_id=new_id(), tenant=self.tenant, sandbox=sandbox)
        return self.call(verbs.FORK_SANDBOX, request, target=sandbox, timeout=timeout)

    def sandbox_info(self, sandbox: str, *, timeout: float = 10.0) -> sb.SandboxInfo:
        request = sb.GetSandbox(request_id=new_id(), tenant=self.tenant, sandbox=sandbox)
        return self.call(verbs.GET_SANDBOX, request, target=sandbox, timeout=timeout)

    def delete_sandbox(self, sandbox: str, *, timeout: float = 30.0) -> None:
        request = sb.DeleteSandbox(request_id=new_id(), tenant=self.tenant, sandbox=sandbox)
        self.call(verbs.DELETE_SANDBOX, request, target=sandbox, timeout=timeout)

    def put_file(self, sandbox: str, path: str, data: bytes, *, timeout: float = 30.0) -> None:
        request = sb.PutFile(
            request_id=new_id(), tenant=self.tenant, sandbox=sandbox, path=path, data=data
        )
        self.call(verbs.PUT_FILE, request, target=sandbox, timeout=timeout)

    def read_file(self, sandbox: str, path: str, *, timeout: float = 30.0) -> bytes:
        request = sb.GetFile(request_id=new_id(), tenant=self.tenant, sandbox=sandbox, path=path)
        content = self.call(verbs.GET_FILE, request, target=sandbox, timeout=timeout)
        return content.data or b""

    def put_blob(self, data: bytes, *, timeout: float = 60.0) -> BlobRef:
        """Store `data` in the object store under `<tenant>/<sha256>` (idempotent)."""

        async def put() -> BlobRef:
            if self._blobs is None:
                self._blobs = await JetStreamBlobs.open(self.nc.jetstream())
            return await self._blobs.put(self.tenant, data)

        return self.run(put(), timeout=timeout)

    # -- tool callbacks ----------------------------------------------------------------------

    def serve_tools(self, interpreter: str, handler: ToolHandler) -> Subscription:
        """Answer tool calls relayed to `fleet.callback.<interpreter>`, each in its own thread."""
        loop = self._loop

        async def on_call(msg: Msg) -> None:
            if not msg.reply:
                return
            try:
                call = _tool_calls.decode(msg.data)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                await msg.respond(_encoder.encode(sb.ToolReply(ok=False, error=str(exc))))
                return
            reply = await _in_thread(loop, lambda: handler(call))
            await msg.respond(_encoder.encode(reply))

        async def on_msg(msg: Msg) -> None:
            # nats-py runs one callback at a time per subscription: answer concurrently.
            task = asyncio.ensure_future(on_call(msg))
            _pending.add(task)
            task.add_done_callback(_pending.discard)

        return self.run(
            self.nc.subscribe(verbs.TOOL_CALL.subject(interpreter), cb=on_msg), timeout=10
        )

    def relay_output(
        self,
        interpreter: str,
        live_subject: str,
        run: str | None,
        seen: Callable[[str], None] = lambda _: None,
    ) -> Subscription:
        """Relay what running cells of `interpreter`'s contexts print (`sb.CellOutput`, from
        the broker) to `live_subject` as `cell_output` deltas of `run`, on the bus loop (no
        thread, no reply: a preview nobody acks); `seen` is told each chunk relayed."""
        nc = self.nc

        async def on_chunk(msg: Msg) -> None:
            try:
                chunk = _cell_output.decode(msg.data)
            except (msgspec.DecodeError, msgspec.ValidationError):
                return
            seen(chunk.text)
            delta = verbs.LiveDelta(kind="cell_output", run=run, text=chunk.text)
            await nc.publish(live_subject, _encoder.encode(delta))

        subject = verbs.cell_output_subject(interpreter)
        return self.run(self.nc.subscribe(subject, cb=on_chunk), timeout=10)

    def unsubscribe(self, subscription: Subscription) -> None:
        with contextlib.suppress(Exception):
            self.run(subscription.unsubscribe(), timeout=5)


_pending: set[asyncio.Future[Any]] = set()


class ToolThreads:
    """Threads for tool calls: a call takes an idle thread if one is waiting, else a new one.

    Every call still has a thread of its own while it runs (a tool may block for minutes on
    a nested interpreter, so there is no cap), but a finished thread waits `idle_s` for the
    next call instead of exiting: starting a thread costs ~50 us here, a third of a warm
    tool round trip's work on this side. Each call runs under a fresh copy of its caller's
    context (the interpreter does that), so nothing but `threading.local` data outlives it.
    """

    def __init__(self, idle_s: float = 30.0) -> None:
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._idle = 0
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()

    def run(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1
                self._jobs.put(job)
                return
        threading.Thread(target=self._work, args=(job,), daemon=True, name="tool-call").start()

    def _work(self, job: Callable[[], None]) -> None:
        while True:
            job()
            with self._lock:
                self._idle += 1
            try:
                job = self._jobs.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:
                    # a job handed over between the timeout and this lock is still ours
                    try:
                        job = self._jobs.get_nowait()
                    except queue.Empty:
                        self._idle -= 1
                        return


_tool_threads = ToolThreads()


def _in_thread(loop: asyncio.AbstractEventLoop, fn: Callable[[], T]) -> Awaitable[T]:
    """Run `fn` in a thread of its own (a tool may block for minutes on a nested interpreter)."""
    future: asyncio.Future[T] = loop.create_future()

    def deliver(ok: bool, value: Any) -> None:
        if future.done():
            return
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    def body() -> None:
        try:
            outcome: tuple[bool, Any] = (True, fn())
        except BaseException as exc:
            outcome = (False, exc)
        # the bus may have closed while the tool ran: then nobody waits for the answer
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(deliver, *outcome)

    _tool_threads.run(body)
    return future
