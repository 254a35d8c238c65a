"""The REPL that runs inside a local sandbox. Standard library only, any Python >= 3.9.

It is copied into the sandbox's own directory and started by the broker as an unprivileged
user in its own network and mount namespaces (providers/local.py). It trusts nothing it runs.

Channel: one AF_UNIX stream socket (fd 0 at start, then moved to a high fd; fd 0 becomes
/dev/null), carrying frames of a 4-byte big-endian length and a JSON object tagged by "t".
stdout and stderr of user code are captured per execution into buffers and returned inside a
frame; nothing user code prints is ever read as protocol.

Threads: the main thread only does I/O (select on the channel and a wake pipe). Cells run on
other threads, so a cell blocked on a host tool does not stop a nested context's cell (dspy's
sandbox facade does exactly that): one long-lived cell thread takes each cell when it is free
(starting a thread per cell, and the copy-on-write faults of its fresh stack after each
checkpoint, were a third of a warm cell's time), and a cell that arrives while it is busy gets
a thread of its own. Forks happen only from the main thread at a quiet point (no execution in
flight, no other thread alive but the cell thread, parked on a lock and holding none):
`refresh_checkpoint()` keeps a stopped copy of the process as of the last completed cell; a
fork request is forwarded to that copy, which forks the child sandbox. So a fork taken while a
cell is in flight still yields the state as of the last completed cell, and no lock held by a
busy thread is ever copied.
"""

from __future__ import annotations

import array
import ast
import builtins
import contextlib
import ctypes
import io
import json
import os
import queue
import resource
import select
import signal
import socket
import struct
import sys
import threading
import time
import warnings
from typing import Any

HEADER = struct.Struct(">I")
CELL_PREFIX = "<cell"
INTERRUPT_GRACE_S = 0.5
STREAM_EVERY_S = 0.1  # a streaming cell's printed output goes out at most this often
STREAM_CHUNK = 16384  # characters per `out` frame
INTERRUPTED = "the cell was interrupted; the sandbox and its variables are kept"
PR_SET_DUMPABLE = 4


class Submission(BaseException):
    """Raised by SUBMIT: a BaseException, so `except Exception` in user code cannot catch it."""

    def __init__(self, value: Any) -> None:
        super().__init__()
        self.value = value


class CellInterrupted(BaseException):
    """Raised in a cell's thread by an interrupt: a BaseException, past `except Exception`."""


class Channel:
    def __init__(self, sock: socket.socket, max_in: int) -> None:
        self.sock = sock
        self.max_in = max_in
        self.buf = bytearray()
        self.fds: list[int] = []
        self.lock = threading.Lock()
        self.dead = False

    def send(self, message: dict[str, Any], fds: tuple[int, ...] = ()) -> None:
        self.send_encoded(encode(message), fds)

    def send_encoded(self, data: bytes, fds: tuple[int, ...] = ()) -> None:
        frame = HEADER.pack(len(data)) + data
        with self.lock:
            if self.dead:
                return
            if fds:
                sent = self.sock.sendmsg(
                    [frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
                )
                frame = frame[sent:]
            if frame:
                self.sock.sendall(frame)

    def read(self) -> bool:
        """Read what is available; False at end of stream."""
        data, ancillary, _flags, _addr = self.sock.recvmsg(1 << 20, socket.CMSG_SPACE(64))
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
                self.fds.extend(fds)
        if not data:
            return False
        self.buf += data
        return True

    def frames(self) -> list[dict[str, Any]]:
        out = []
        while len(self.buf) >= HEADER.size:
            (size,) = HEADER.unpack_from(self.buf)
            if size > self.max_in:
                raise ValueError("frame over the limit")
            if len(self.buf) < HEADER.size + size:
                break
            body = bytes(self.buf[HEADER.size : HEADER.size + size])
            del self.buf[: HEADER.size + size]
            out.append(json.loads(body))
        return out


class Execution:
    def __init__(self, request: dict[str, Any]) -> None:
        self.id: str = request["exec"]
        self.context: str = request["ctx"]
        self.request = request
        self.out = io.StringIO()
        self.out_size = 0
        self.truncated = False
        self.lock = threading.Lock()
        # interrupts: `guard` orders "the thread is in user code" against raising in it, so
        # an interrupt never lands in the runner's own code; `answered` lets exactly one of
        # the cell's thread and an interrupt's deadline send the answer
        self.guard = threading.Lock()
        self.thread: int | None = None
        self.in_user_code = False
        self.raised = False
        self.interrupted = threading.Event()
        self.answered = False
        self.on_cell_thread = False
        self.calls: set[int] = set()
        # live output (`stream`): what of `out` was sent as `out` frames, and when last
        self.stream = bool(request.get("stream"))
        self.streamed = 0
        self.streamed_at = time.monotonic()

    def write(self, text: str, cap: int) -> None:
        with self.lock:
            if self.out_size >= cap:
                self.truncated = True
                return
            text = text[: cap - self.out_size]
            self.out_size += len(text)
            self.out.write(text)


class Router(io.TextIOBase):
    """sys.stdout / sys.stderr: each write lands in the buffer of the execution it belongs to."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        execution = self.runner.execution_for_thread()
        if execution is not None:
            execution.write(text, self.runner.output_cap)
        return len(text)

    def flush(self) -> None:
        return None


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":"), allow_nan=False).encode()


def jsonable(value: Any) -> Any:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return repr(value)
    return value


def describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    tb = exc.__traceback__
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith(CELL_PREFIX):
            line = tb.tb_lineno
        tb = tb.tb_next
    return text if line is None else f"{text} (line {line})"


class Runner:
    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.pid = os.getpid()
        self.contexts: dict[str, dict[str, Any]] = {}
        self.context_tools: dict[str, set[str]] = {}
        self.blobs: dict[str, str] = {}
        # values that cannot be mutated (a string, a number) are decoded once and kept instead
        # of their text: RLM re-sends its inputs, often one big string, every iteration
        self.immutable: dict[str, Any] = {}
        self.inflight: dict[str, Execution] = {}
        self.by_context: dict[str, Execution] = {}
        self.by_thread: dict[int, Execution] = {}
        self.threads: dict[str, threading.Thread] = {}
        self.cell_go: threading.Lock | None = None
        self.cell_busy: threading.Lock | None = None
        self.cell_job: Execution | None = None
        self.pending: dict[int, queue.Queue[dict[str, Any] | None]] = {}
        self.pending_lock = threading.Lock()
        self.tool_ids = 0
        self.output_cap = 1 << 20
        self.max_out = 4 << 20
        self.cell_cpu_s = 0
        self.checkpoint: tuple[int, socket.socket] | None = None
        self.checkpoint_ok = False
        self.retired: list[int] = []
        self.auto_checkpoint = True
        self.dirty = True
        self.wake_r, self.wake_w = self.wake_pipe()
        self.out_r = self.output_pipe()
        self.out_lock = threading.Lock()
        self.cells = 0
        self.interrupts: dict[str, float] = {}  # execution id -> when to answer for it

    # -- setup -------------------------------------------------------------------------------

    @staticmethod
    def wake_pipe() -> tuple[int, int]:
        """Wakes the main thread's select: finished cells write to it, and so does the signal
        machinery (SIGXCPU may land on a cell's thread; its handler runs on the main thread)."""
        read, write = os.pipe()
        os.set_blocking(write, False)
        signal.set_wakeup_fd(write)
        return read, write

    def init(self, msg: dict[str, Any]) -> None:
        limits = msg.get("limits", {})
        for name, value in limits.items():
            kind = getattr(resource, name)
            resource.setrlimit(kind, (int(value), int(value)))
        self.cell_cpu_s = int(msg.get("cell_cpu_s", 0))
        self.auto_checkpoint = bool(msg.get("checkpoints", True))
        self.output_cap = int(msg.get("output_cap", self.output_cap))
        self.max_out = int(msg.get("max_frame", self.max_out))
        self.channel.max_in = int(msg.get("max_in", self.channel.max_in))

    @staticmethod
    def output_pipe() -> int:
        """fds 1 and 2 become a pipe this process reads, so output written below Python (a
        subprocess, os.write, a C extension) reaches the running cell too."""
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.dup2(write, 1)
        os.dup2(write, 2)
        os.close(write)
        return read

    def drain_output(self, into: Execution | None) -> None:
        """Move what fds 1/2 hold to `into` (or the latest cell); never blocks."""
        with self.out_lock:
            while True:
                try:
                    chunk = os.read(self.out_r, 65536)
                except BlockingIOError:
                    return
                if not chunk:
                    return
                target = into or self.execution_for_thread()
                if target is not None:
                    target.write(chunk.decode(errors="replace"), self.output_cap)

    # -- stdout routing ----------------------------------------------------------------------

    def execution_for_thread(self) -> Execution | None:
        found = self.by_thread.get(threading.get_ident())
        if found is not None:
            return found
        running = list(self.inflight.values())
        return running[-1] if running else None

    # -- tools -------------------------------------------------------------------------------

    def call_tool(self, context: str, name: str, args: tuple[Any, ...], kwargs: Any) -> Any:
        execution = self.by_context.get(context)
        if execution is None:
            raise RuntimeError(f"host tool {name!r} called outside an execution")
        try:
            json.dumps([args, kwargs], allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"arguments of host tool {name!r} must be JSON-compatible: {exc}"
            ) from None
        with self.pending_lock:
            self.tool_ids += 1
            call_id = self.tool_ids
            answer: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=1)
            self.pending[call_id] = answer
            execution.calls.add(call_id)
        try:
            self.channel.send(
                {
                    "t": "tool",
                    "id": call_id,
                    "exec": execution.id,
                    "name": name,
                    "args": list(args),
                    "kwargs": dict(kwargs),
                }
            )
            reply = answer.get()
        finally:
            with self.pending_lock:
                self.pending.pop(call_id, None)
                execution.calls.discard(call_id)
        if reply is None:
            raise RuntimeError("the host closed the channel during a tool call")
        if not reply.get("ok"):
            raise RuntimeError(str(reply.get("error")))
        return reply.get("value")

    def make_tool(self, context: str, name: str) -> Any:
        def tool(*args: Any, **kwargs: Any) -> Any:
            return self.call_tool(context, name, args, kwargs)

        tool.__name__ = name
        tool.__qualname__ = name
        return tool

    # -- execution ---------------------------------------------------------------------------

    def make_submit(self, fields: list[dict[str, Any]] | None) -> Any:
        def stop_tracer(frame: Any, event: str, arg: Any) -> Any:
            if frame.f_code.co_filename.startswith(CELL_PREFIX):
                if event in ("line", "call"):
                    raise Submission(None)
                return stop_tracer
            return None

        def submit(*args: Any, **kwargs: Any) -> None:
            if fields is None:
                if len(args) != 1 or kwargs:
                    raise TypeError("SUBMIT requires one output value")
                value: Any = {"output": args[0]}
            else:
                names = [field["name"] for field in fields]
                if args and kwargs:
                    raise TypeError("SUBMIT accepts positional or keyword values, not both")
                if len(args) > len(names):
                    raise TypeError(f"SUBMIT takes {len(names)} values: {', '.join(names)}")
                value = dict(zip(names, args, strict=False)) if args else dict(kwargs)
                if set(value) != set(names):
                    missing = sorted(set(names) - set(value))
                    extra = sorted(set(value) - set(names))
                    raise TypeError(
                        f"SUBMIT fields do not match the output fields {names}: "
                        f"missing {missing}, unexpected {extra}"
                    )
            execution = self.execution_for_thread()
            if execution is not None and "final" not in execution.request:
                execution.request["final"] = value
            # A bare `except:` in the cell cannot carry on: every later line raises again.
            frame: Any = sys._getframe(1)
            while frame is not None:
                if frame.f_code.co_filename.startswith(CELL_PREFIX):
                    frame.f_trace = stop_tracer
                frame = frame.f_back
            sys.settrace(stop_tracer)
            raise Submission(value)

        return submit

    def configure(self, context: str, request: dict[str, Any]) -> dict[str, Any]:
        namespace = self.contexts.setdefault(context, {"__name__": "__main__"})
        for name in self.context_tools.get(context, set()):
            namespace.pop(name, None)
        tools = list(request.get("tools", []))
        for name in tools:
            namespace[name] = self.make_tool(context, name)
        self.context_tools[context] = set(tools)
        namespace["SUBMIT"] = self.make_submit(request.get("output_fields"))
        if "__builtins__" not in namespace:
            namespace["__builtins__"] = vars(builtins).copy()
        for name, digest in request.get("vars", {}).items():
            namespace[name] = self.variable(digest)
        return namespace

    def variable(self, digest: str) -> Any:
        """A fresh value for each cell (a cell may mutate a list it was given), except for
        immutable ones, which are decoded once."""
        if digest in self.immutable:
            return self.immutable[digest]
        value = json.loads(self.blobs[digest])
        if value is None or isinstance(value, (str, int, float, bool)):
            self.immutable[digest] = value
            del self.blobs[digest]
        return value

    def run(self, execution: Execution) -> tuple[dict[str, Any], bytes]:
        """The cell's answer, and its frame body (encoded once: it can be megabytes)."""
        request = execution.request
        namespace = self.configure(execution.context, request)
        self.cells += 1
        filename = f"{CELL_PREFIX}-{self.cells}>"
        outcome: dict[str, Any]
        try:
            try:
                self.enter_user_code(execution)
                tree = ast.parse(request["code"], filename=filename, mode="exec")
                body = tree.body
                last = body.pop() if body and isinstance(body[-1], ast.Expr) else None
                exec(compile(tree, filename, "exec"), namespace)  # noqa: S102 - the product
                value = None
                if last is not None:
                    expr = ast.Expression(last.value)
                    value = eval(compile(expr, filename, "eval"), namespace)  # noqa: S307
            finally:
                self.leave_user_code(execution)
            outcome = {"t": "result", "value": jsonable(value)}
        except Submission as submission:
            final = request.get("final", submission.value)
            outcome = {"t": "final", "value": jsonable(final)}
        except CellInterrupted:
            self.leave_user_code(execution)  # the interrupt may have landed in the finally
            outcome = {"t": "error", "error": INTERRUPTED}
        except SyntaxError as exc:
            outcome = {"t": "syntax", "error": f"{type(exc).__name__}: {exc}"}
        except MemoryError as exc:
            outcome = {"t": "fatal", "kind": "memory", "error": describe(exc)}
        except BaseException as exc:
            if "final" in request:
                outcome = {"t": "final", "value": jsonable(request["final"])}
            elif execution.interrupted.is_set():
                outcome = {"t": "error", "error": INTERRUPTED}  # e.g. a tool call it ended
            else:
                outcome = {"t": "error", "error": describe(exc)}
        finally:
            sys.settrace(None)
        if os.getpid() != self.pid:
            os._exit(0)  # a process user code forked must never answer on the channel
        outcome["exec"] = execution.id
        self.drain_output(execution)
        outcome["stdout"] = execution.out.getvalue()
        if execution.truncated:
            outcome["stdout"] += f"\n[output truncated at {self.output_cap} characters]"
        data = encode(outcome)
        size = len(data)
        if size > self.max_out - 64:
            outcome = {
                "t": "error",
                "exec": execution.id,
                "stdout": "",
                "error": f"the cell's result is {size} bytes, over the {self.max_out}-byte "
                "frame limit: write large results to a file in the workspace",
            }
            data = encode(outcome)
        return outcome, data

    def start_cell_thread(self) -> None:
        """The long-lived cell thread, started at the first cell (a sandbox that never runs
        one, e.g. a fork never used, spends no task of the family's RLIMIT_NPROC on it).
        `cell_busy` is held from the hand-over of a cell until its answer is sent; between
        cells the thread waits on `cell_go`, holding nothing."""
        go, busy = threading.Lock(), threading.Lock()
        go.acquire()
        try:
            threading.Thread(
                target=self.cell_thread, args=(go, busy), name="cell", daemon=True
            ).start()
        except RuntimeError:  # the process limit is spent: cells get threads of their own
            return
        self.cell_go, self.cell_busy = go, busy

    def cell_thread(self, go: threading.Lock, busy: threading.Lock) -> None:
        while True:
            go.acquire()
            job, self.cell_job = self.cell_job, None
            try:
                if job is not None:
                    self.thread_main(job)
            except OSError:
                pass  # the answer could not be sent: the channel is gone, and so is the runner
            finally:
                busy.release()
            if self.cell_go is not go:
                return  # an interrupt gave up on this thread: a fresh one serves cells now

    def hand_to_cell_thread(self, execution: Execution) -> bool:
        if self.cell_go is None:
            self.start_cell_thread()
        if self.cell_go is None or self.cell_busy is None:
            return False
        # with no other cell in flight it has answered and is only returning: wait for it
        alone = len(self.inflight) == 1
        if not (self.cell_busy.acquire(timeout=1) if alone else self.cell_busy.acquire(False)):
            return False
        self.cell_job = execution
        execution.on_cell_thread = True
        self.cell_go.release()
        return True

    def thread_main(self, execution: Execution) -> None:
        self.by_thread[threading.get_ident()] = execution
        try:
            outcome, data = self.run(execution)
        except BaseException as exc:  # a failure of the runner itself
            outcome = {"t": "fatal", "kind": "runner", "error": describe(exc), "exec": execution.id}
            data = encode(outcome)
        finally:
            self.by_thread.pop(threading.get_ident(), None)
        if not self.claim_answer(execution):
            return  # an interrupt answered for it: this thread is a stray now
        self.channel.send_encoded(data)
        if outcome["t"] == "fatal":
            os._exit(3)
        # Answer first, then wake the main thread to take the checkpoint: the fork overlaps
        # the broker's next round trip. A fork request that gets in before this wake-up
        # takes the checkpoint itself (`fork`), so it still sees this cell. Without
        # checkpoints there is nothing to wake for (threads are reaped at the next cell).
        if self.auto_checkpoint:
            with contextlib.suppress(BlockingIOError):
                os.write(self.wake_w, b"x")

    # -- interrupts --------------------------------------------------------------------------

    def enter_user_code(self, execution: Execution) -> None:
        with execution.guard:
            execution.thread = threading.get_ident()
            execution.in_user_code = True
        if execution.interrupted.is_set():
            raise CellInterrupted

    def leave_user_code(self, execution: Execution) -> None:
        """After this no interrupt is raised in the thread, and none is left pending."""
        with execution.guard:
            execution.in_user_code = False
            if not execution.raised or execution.thread is None:
                return
            execution.raised = False
            thread = ctypes.c_ulong(execution.thread)
            SET_ASYNC_EXC(thread, None)
        # Clearing leaves CPython's "async exception pending" signal set (3.11 signals the
        # interpreter on every PyThreadState_SetAsyncExc, NULL included, and unsignals only
        # when a thread takes a real one), and with a trace function installed every Python
        # call then spins in its RESUME for ever: the next SUBMIT (it sets one) never
        # answered. So this thread takes one of its own here, which unsignals. Only C calls
        # until then (a Python call would spin if a tracer is still set).
        try:
            SET_ASYNC_EXC(thread, ctypes.py_object(CellInterrupted))
            for _ in range(1_000_000):  # lands at the first backward jump (or sooner)
                pass
        except CellInterrupted:
            return
        SET_ASYNC_EXC(thread, None)  # it never landed: at least none is left pending

    def claim_answer(self, execution: Execution) -> bool:
        """Exactly one answer per execution: the first caller sends it, and frees its context."""
        with execution.lock:
            if execution.answered:
                return False
            execution.answered = True
        self.inflight.pop(execution.id, None)
        if self.by_context.get(execution.context) is execution:
            del self.by_context[execution.context]
        self.interrupts.pop(execution.id, None)
        return True

    def interrupt(self, msg: dict[str, Any]) -> None:
        """Raise CellInterrupted in the cell's thread if it is in user code; wake a sleep or a
        host tool call it waits on; answer for it if it has not stopped within the grace."""
        execution = self.inflight.get(msg["exec"])
        running = execution is not None and execution.context == msg["ctx"]
        if execution is not None and running and not execution.interrupted.is_set():
            execution.interrupted.set()
            if execution.guard.acquire(timeout=INTERRUPT_GRACE_S):
                try:
                    if execution.in_user_code and execution.thread is not None:
                        execution.raised = True
                        set_async_exc(execution.thread, CellInterrupted)
                finally:
                    execution.guard.release()
            with self.pending_lock:
                waiting = [self.pending[c] for c in execution.calls if c in self.pending]
            for answer in waiting:
                with contextlib.suppress(queue.Full):
                    answer.put_nowait({"ok": False, "error": INTERRUPTED})
            self.interrupts[execution.id] = time.monotonic() + INTERRUPT_GRACE_S
        self.channel.send({"t": "interrupted", "req": msg["req"], "running": running})

    def expire_interrupts(self) -> None:
        now = time.monotonic()
        for exec_id, deadline in list(self.interrupts.items()):
            if deadline > now:
                continue
            execution = self.inflight.get(exec_id)
            if execution is None or not self.claim_answer(execution):
                self.interrupts.pop(exec_id, None)
                continue
            # its thread is a stray now: never waited for (reap_threads, the cell thread's
            # busy lock); the next cell gets a fresh cell thread
            self.threads.pop(exec_id, None)
            if execution.on_cell_thread:
                self.cell_go = self.cell_busy = None
            self.drain_output(execution)
            self.channel.send(
                {
                    "t": "error",
                    "exec": exec_id,
                    "stdout": execution.out.getvalue(),
                    "error": f"{INTERRUPTED} (it did not stop within {INTERRUPT_GRACE_S:g} s: "
                    "its thread may still be running)",
                }
            )

    def interrupt_timeout(self) -> float | None:
        if not self.interrupts:
            return None
        return max(0.0, min(self.interrupts.values()) - time.monotonic())

    def wait_s(self) -> float | None:
        """How long the main loop may sleep: until the next interrupt deadline, and no longer
        than `STREAM_EVERY_S` while a streaming cell runs."""
        wait = self.interrupt_timeout()
        if any(e.stream for e in list(self.inflight.values())):
            wait = STREAM_EVERY_S if wait is None else min(wait, STREAM_EVERY_S)
        return wait

    def stream_output(self) -> None:
        """Send what streaming cells printed since their last `out` frame, at most every
        `STREAM_EVERY_S` per cell and `STREAM_CHUNK` characters a frame (the rest goes next
        time). The cell's answer still carries all of its output; these frames are a preview.
        One sent after the answer (the cell ended meanwhile) is dropped by the broker."""
        now = time.monotonic()
        for execution in list(self.inflight.values()):
            if not execution.stream or now - execution.streamed_at < STREAM_EVERY_S:
                continue
            with execution.lock:
                if execution.out_size <= execution.streamed:
                    continue
                text = execution.out.getvalue()[
                    execution.streamed : execution.streamed + STREAM_CHUNK
                ]
                execution.streamed += len(text)
            execution.streamed_at = now
            self.channel.send({"t": "out", "exec": execution.id, "text": text})

    def start_execution(self, request: dict[str, Any]) -> None:
        missing = [
            d
            for d in request.get("vars", {}).values()
            if d not in self.blobs and d not in self.immutable
        ]
        for digest, text in request.get("blobs", {}).items():
            if digest not in self.immutable:
                self.blobs[digest] = text
        missing = [d for d in missing if d not in self.blobs]  # sent with this request
        if missing:
            self.channel.send({"t": "missing", "exec": request["exec"], "hashes": missing})
            return
        context = request["ctx"]
        if context in self.by_context:
            self.channel.send(
                {
                    "t": "error",
                    "exec": request["exec"],
                    "stdout": "",
                    "error": f"context {context!r} is already executing a cell",
                }
            )
            return
        if not self.inflight:
            if self.auto_checkpoint:
                self.refresh_checkpoint()
            else:
                self.reap_threads()
                # a checkpoint taken for an earlier fork is stale once this cell starts
                self.drop_checkpoint()
                self.checkpoint_ok = False
            if self.cell_cpu_s:
                used = resource.getrusage(resource.RUSAGE_SELF)
                spent = int(used.ru_utime + used.ru_stime) + 1
                _soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
                soft = spent + self.cell_cpu_s
                if hard != resource.RLIM_INFINITY:
                    soft = min(soft, hard)
                resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
        execution = Execution(request)
        self.inflight[execution.id] = execution
        self.by_context[context] = execution
        self.dirty = True
        if self.hand_to_cell_thread(execution):
            return
        thread = threading.Thread(
            target=self.thread_main, args=(execution,), name="cell-of-its-own", daemon=True
        )
        self.threads[execution.id] = thread
        thread.start()

    # -- fork --------------------------------------------------------------------------------

    def quiet(self) -> bool:
        if self.inflight:
            return False
        if self.cell_busy is None:
            return threading.active_count() == 1
        if not self.cell_busy.acquire(timeout=1):  # the last cell's answer is still going out
            return False
        self.cell_busy.release()
        return threading.active_count() == 2  # this thread and the parked cell thread

    def refresh_checkpoint(self) -> None:
        self.reap_threads()
        if not self.dirty and self.checkpoint is not None:
            return
        if not self.quiet():
            self.checkpoint_ok = False
            return
        self.drop_checkpoint()
        mine, theirs = socket.socketpair()
        try:
            pid = os.fork()
        except OSError:  # e.g. the process limit is spent: no checkpoint, forks will say so
            mine.close()
            theirs.close()
            self.checkpoint_ok = False
            return
        if pid == 0:
            mine.close()
            self.checkpoint_main(theirs)
            os._exit(0)
        theirs.close()
        self.checkpoint = (pid, mine)
        self.checkpoint_ok = True
        self.dirty = False

    def reap_threads(self) -> None:
        for exec_id, thread in list(self.threads.items()):
            if exec_id not in self.inflight:
                thread.join(timeout=1)  # it has answered; it is only returning
                if not thread.is_alive():
                    del self.threads[exec_id]

    def drop_checkpoint(self) -> None:
        """Retire the old copy (it exits on end of stream) and reap earlier ones, never waiting."""
        if self.checkpoint is not None:
            pid, sock = self.checkpoint
            sock.close()
            self.retired.append(pid)
            self.checkpoint = None
        for pid in list(self.retired):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    continue
            self.retired.remove(pid)

    def checkpoint_main(self, control: socket.socket) -> None:
        """A stopped copy as of the last completed cell; each request forks a child sandbox."""
        self.channel.dead = True
        self.channel.sock.close()
        signal.set_wakeup_fd(-1)
        os.close(self.wake_r)
        os.close(self.wake_w)
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        inbox = Channel(control, 1 << 20)
        while True:
            if not inbox.read():
                return
            for msg in inbox.frames():
                fd = inbox.fds.pop(0)
                if os.fork() == 0:
                    control.close()
                    self.become_child(msg, fd)
                    os._exit(0)
                os.close(fd)

    def become_child(self, msg: dict[str, Any], fd: int) -> None:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        os.chdir(msg["cwd"])
        os.environ.update(msg.get("env", {}))
        sock = socket.socket(fileno=fd)
        self.channel = Channel(sock, self.channel.max_in)
        self.pid = os.getpid()
        self.checkpoint = None
        self.dirty = True
        self.inflight.clear()
        self.by_context.clear()
        self.by_thread.clear()
        self.threads.clear()
        self.cell_go = self.cell_busy = self.cell_job = None  # that thread is not in this process
        self.pending.clear()
        self.interrupts.clear()
        self.wake_r, self.wake_w = self.wake_pipe()
        os.close(self.out_r)
        self.out_r = self.output_pipe()
        self.channel.send({"t": "ready", "pid": os.getpid()})
        self.serve()

    def fork(self, msg: dict[str, Any]) -> None:
        fd = self.channel.fds.pop(0)
        try:
            if not self.inflight:
                # the last cell may have answered a moment ago (its thread still returning,
                # the wake-up not yet read): the checkpoint must be of that cell
                self.refresh_checkpoint()
            if self.checkpoint is None or not self.checkpoint_ok:
                reason = (
                    "no quiet point to fork from: threads started by an earlier cell were "
                    "still running when it ended"
                    if self.auto_checkpoint or not self.inflight
                    else "this sandbox keeps no checkpoint (created with fork_ready=False) and "
                    "a cell is running: fork it between cells"
                )
                self.channel.send({"t": "fork_failed", "fork": msg["fork"], "error": reason})
                return
            forwarded = Channel(self.checkpoint[1], 1 << 20)
            forwarded.send({"cwd": msg["cwd"], "env": msg.get("env", {})}, (fd,))
            self.channel.send({"t": "forked", "fork": msg["fork"]})
        finally:
            os.close(fd)

    # -- main loop ---------------------------------------------------------------------------

    def handle(self, msg: dict[str, Any]) -> None:
        kind = msg.get("t")
        if kind == "exec":
            self.start_execution(msg)
        elif kind == "tool_result":
            with self.pending_lock:
                answer = self.pending.get(msg["id"])
            if answer is not None:
                answer.put(msg)
        elif kind == "open":
            self.contexts.setdefault(msg["ctx"], {"__name__": "__main__"})
            self.dirty = True
            self.channel.send({"t": "ok", "req": msg["req"]})
        elif kind == "close":
            self.contexts.pop(msg["ctx"], None)
            self.context_tools.pop(msg["ctx"], None)
            self.dirty = True
            self.channel.send({"t": "ok", "req": msg["req"]})
        elif kind == "fork":
            self.fork(msg)
        elif kind == "interrupt":
            self.interrupt(msg)
        elif kind == "init":
            self.init(msg)
            self.channel.send({"t": "ready", "pid": os.getpid()})
        elif kind == "exit":
            os._exit(0)
        else:
            raise ValueError(f"unknown request {kind!r}")

    def serve(self) -> None:
        while True:
            sock_fd = self.channel.sock.fileno()
            wait = self.wait_s()
            readable, _, _ = select.select([sock_fd, self.wake_r, self.out_r], [], [], wait)
            if self.interrupts:
                self.expire_interrupts()
            if self.out_r in readable:
                self.drain_output(None)
            if self.inflight:
                self.stream_output()
            if self.wake_r in readable:
                os.read(self.wake_r, 4096)
                if not self.inflight and self.auto_checkpoint:
                    self.refresh_checkpoint()  # the cell has answered: this overlaps the reply
                else:
                    self.reap_threads()
            if sock_fd in readable:
                if not self.channel.read():
                    os._exit(0)  # the broker is gone: so is this sandbox
                for msg in self.channel.frames():
                    self.handle(msg)


SET_ASYNC_EXC = ctypes.pythonapi.PyThreadState_SetAsyncExc


def set_async_exc(thread: int, exc: type[BaseException] | None) -> None:
    """Raise `exc` in `thread` at its next bytecode (None: clear one pending)."""
    # None is passed as NULL (clear); py_object(None) would be Py_None, a bogus exception
    arg = None if exc is None else ctypes.py_object(exc)
    SET_ASYNC_EXC(ctypes.c_ulong(thread), arg)


def interruptible_sleep(runner: Runner) -> Any:
    """time.sleep for cells: an interrupt wakes it, and the CellInterrupted already pending
    for the thread is raised at its next bytecode (it would wait for a C-level sleep to
    end). Raising here too could land a second one outside user code. Elsewhere the real
    sleep."""
    real = time.sleep

    def sleep(secs: float) -> None:
        execution = runner.by_thread.get(threading.get_ident())
        if execution is None:
            return real(secs)
        if secs < 0:
            raise ValueError("sleep length must be non-negative")
        execution.interrupted.wait(secs)
        return None

    sleep.__doc__ = real.__doc__
    return sleep


def confine() -> None:
    """The seccomp filter (confine.py, beside this file) before anything else runs: every
    process of the sandbox descends from this one and inherits it. A runner that cannot
    install it exits, so the sandbox never starts unconfined."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "confine.py")
    spec = importlib.util.spec_from_file_location("fleet_confine", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"runner: cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.install()
    if not module.installed():
        raise SystemExit("runner: the seccomp filter is not in force")


def be_init() -> None:
    """PID 1 of the fork family's pid namespace: the runner forks itself at start and the
    parent stays behind as init, so the family outlives any one member (a fork whose parent
    was stopped is re-parented here and keeps running). It only reaps; it holds no channel,
    runs no user code, and has no signal handlers, so nothing inside the namespace can
    signal it (the kernel drops what an init has no handler for). It exits once the
    namespace is empty; the broker ends the family sooner by SIGKILLing its process group
    from outside (local.py, `family_leave`), which takes every process in the namespace."""
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGXCPU):
        signal.signal(number, signal.SIG_DFL)
    # not dumpable: its /proc entries (mem, environ) are closed to the family's own uid
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(devnull, fd)
    os.close(devnull)
    while True:
        try:
            os.wait()
        except ChildProcessError:
            os._exit(0)


def main() -> None:
    confine()
    if os.getpid() == 1:
        if os.fork() != 0:
            be_init()
        os.setsid()  # a group of its own: the broker's stop of this member is a killpg
    sock = socket.socket(fileno=os.dup(0))
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.close(devnull)
    channel = Channel(sock, 64 << 20)
    # Python >= 3.12 warns on every fork() with another thread alive: the runner forks only
    # with its cell thread parked on a lock, holding none (see the module docstring)
    warnings.filterwarnings("ignore", r"This process .* is multi-threaded", DeprecationWarning)
    runner = Runner(channel)
    time.sleep = interruptible_sleep(runner)
    sys.stdout = Router(runner)
    sys.stderr = Router(runner)
    sys.stdin = io.StringIO()

    def closed_in_child() -> None:
        # A process forked by user code must not write on the channel, nor keep it (or the
        # checkpoint's control socket) open: the broker and the checkpoint see end of stream
        # when the runner dies, not when its last child does.
        runner.channel.dead = True
        runner.channel.sock.close()
        if runner.checkpoint is not None:
            runner.checkpoint[1].close()

    os.register_at_fork(after_in_child=closed_in_child)

    def on_cpu_limit(_sig: int, _frame: Any) -> None:
        if runner.channel.lock.acquire(timeout=1):
            runner.channel.lock.release()
            runner.channel.send({"t": "fatal", "kind": "cpu", "error": "CPU time limit reached"})
        os._exit(4)

    signal.signal(signal.SIGXCPU, on_cpu_limit)
    runner.serve()


if __name__ == "__main__":
    main()
