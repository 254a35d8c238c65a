"""`RemoteInterpreter`: dspy 3.4.1's `CodeInterpreter`, running code in a broker sandbox.

An interpreter is a REPL *context* on a sandbox (usually the session's): `start()` opens the
context and the tool inbox, `execute()` runs a cell over the bus, `shutdown()` closes the
context and is terminal for the interpreter, but never deletes the sandbox.

The contract, as dspy's own `LocalInterpreter` keeps it:
- `tools` is a plain mutable dict, re-read at every execute and at every tool call (a tool
  removed from it is gone, even mid-run);
- variables must be JSON-compatible after `pydantic_core.to_jsonable_python` (so `dspy.History`
  and other pydantic inputs work); each is sent once by content hash and cached in the sandbox,
  because RLM re-sends every input on every iteration;
- `SUBMIT(...)` ends the cell at once and `execute` returns `FinalOutput`;
- `SyntaxError` for code that does not parse, `CodeExecutionError` for errors the model can
  fix, a bare `CodeInterpreterError` (terminal) when the sandbox stopped or the bus failed.
"""

import concurrent.futures
import contextlib
import contextvars
import hashlib
import inspect
import json
import keyword
import threading
import time
from collections.abc import Callable
from typing import Any

from dspy.primitives.code_interpreter import (
    CodeExecutionError,
    CodeInterpreterError,
    FinalOutput,
)
from dspy.primitives.local_interpreter import _await_in_sync
from nats.aio.subscription import Subscription
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from pydantic_core import to_jsonable_python

from fleet_agent.sandbox_bus import SandboxBus
from fleet_events import bus as verbs
from fleet_events import sandbox as sb
from fleet_events.envelope import new_id
from fleet_mesh import rpc

RESERVED = frozenset({"SUBMIT", "__builtins__"})
# variables whose JSON is bigger than this go to the object store (design: ~256 KiB inline)
OFFLOAD_BYTES = 256 * 1024

EXECUTION_INSTRUCTIONS = (
    "Code runs as Python in a persistent REPL inside an isolated sandbox (no network, its own "
    "workspace directory as the current directory). State, imports, functions and variables "
    "persist between steps. Host tools and SUBMIT are global functions; tool arguments and "
    "results must be JSON-compatible. Large inputs are files in the workspace."
)


def _valid_name(name: object) -> bool:
    return isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)


NO_CONTEXT = "no_context"
"""The broker's error code for a REPL context it does not hold (`ContextNotOpen`)."""


class _Encoded:
    __slots__ = ("digest", "text", "value")

    def __init__(self, value: Any, text: str, digest: str) -> None:
        self.value = value
        self.text = text
        self.digest = digest


class RemoteInterpreter:
    execution_instructions = EXECUTION_INSTRUCTIONS

    def __init__(
        self,
        bus: SandboxBus,
        sandbox: str,
        *,
        tools: dict[str, Callable[..., Any]] | None = None,
        output_fields: list[dict[str, Any]] | None = None,
        context: str | None = None,
        wall_s: float | None = None,
        callback_timeout_s: float = 600.0,
        request_timeout_s: float = 3600.0,
        liveness_s: float = 10.0,
        lost_after_s: float = 15.0,
        live: tuple[str, str | None] | None = None,
    ) -> None:
        """`live`: (live subject, run) to relay what running cells print to, as
        `cell_output` deltas while they run (the broker sends it at most every 100 ms)."""
        self.tools: dict[str, Callable[..., Any]] = dict(tools or {})
        self.output_fields = output_fields
        self.bus = bus
        self.sandbox = sandbox
        self.id = new_id()
        self.context = context or self.id
        self.wall_s = wall_s
        self.callback_timeout_s = callback_timeout_s
        self.request_timeout_s = request_timeout_s
        self.liveness_s = liveness_s
        self.lost_after_s = lost_after_s
        """How long probes may find no broker before the cell is given up: a broker restarting,
        or the bus reconnecting after a NATS restart, answers again within it."""
        self._state_lock = threading.Lock()
        self._exec_lock = threading.Lock()
        self._started = False
        self._ended = False
        self._inbox: Subscription | None = None
        self.live = live
        self.streamed_chars = 0
        """Characters of the running (or last) cell's output already relayed live."""
        self._output: Subscription | None = None
        self._sent: set[str] = set()
        self._memo: dict[int, _Encoded] = {}
        self.context_lost = False
        """The last cell failed because the sandbox answers again without this REPL context
        (a `RecordingInterpreter` rebuilds it from the cells it ran; this one cannot)."""
        self._caller: contextvars.Context = contextvars.copy_context()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, *, relay: bool = True) -> None:
        """Serve the context's host tools and open it on the sandbox; `relay`: relay what its
        cells print live as well (a rebuild relays nothing until its replays are done)."""
        with self._state_lock:
            if self._ended:
                raise CodeInterpreterError("this interpreter has been shut down")
            if self._started:
                return
            try:
                self._inbox = self.bus.serve_tools(self.id, self._on_tool)
                if relay:
                    self._relay_live()
                request = sb.OpenContext(
                    request_id=new_id(),
                    tenant=self.bus.tenant,
                    sandbox=self.sandbox,
                    context=self.context,
                    interpreter=self.id,
                )
                self.bus.call(
                    verbs.OPEN_CONTEXT, request, target=self.sandbox, timeout=30,
                    reach_s=self.lost_after_s,
                )  # fmt: skip
            except Exception as exc:
                self._ended = True
                self._close_inboxes()
                raise CodeInterpreterError(
                    f"cannot open a REPL context on sandbox {self.sandbox}: {_describe(exc)}"
                ) from exc
            self._started = True

    def _relay_live(self) -> None:
        if self.live is not None and self._output is None:
            subject, run = self.live
            self._output = self.bus.relay_output(self.id, subject, run, self._streamed)

    def _reopen(self) -> None:
        """Open the context again on a sandbox that lost it (`ContextLost`): nothing is held
        there any more, so every variable is sent again with the next cell."""
        with self._state_lock:
            self._ended = self._started = self.context_lost = False
            self._sent = set()
            self._memo = {}
        self.start(relay=False)

    def shutdown(self) -> None:
        with self._state_lock:
            if self._ended:
                return
            self._ended = True
            started, self._started = self._started, False
        if not started:
            return
        request = sb.CloseContext(
            request_id=new_id(), tenant=self.bus.tenant, sandbox=self.sandbox, context=self.context
        )
        try:
            # A stopped or unreachable sandbox has no context left to close.
            with contextlib.suppress(Exception):
                self.bus.call(verbs.CLOSE_CONTEXT, request, target=self.sandbox, timeout=10)
        finally:
            self._close_inboxes()

    def _streamed(self, text: str) -> None:
        self.streamed_chars += len(text)

    def _close_inboxes(self) -> None:
        for subscription in (self._inbox, self._output):
            if subscription is not None:
                self.bus.unsubscribe(subscription)
        self._inbox = self._output = None

    def __enter__(self) -> "RemoteInterpreter":
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.shutdown()

    def __call__(self, code: str, variables: dict[str, Any] | None = None) -> Any:
        return self.execute(code, variables)

    # -- execution ---------------------------------------------------------------------------

    def execute(self, code: str, variables: dict[str, Any] | None = None) -> Any:
        if not self._exec_lock.acquire(blocking=False):
            raise CodeInterpreterError("this interpreter already has an execution in flight")
        try:
            return self._execute(code, variables)
        finally:
            self._exec_lock.release()

    def _execute(self, code: str, variables: dict[str, Any] | None) -> Any:
        if self._ended:
            raise CodeInterpreterError("this interpreter has been shut down")
        if not isinstance(code, str):
            raise CodeInterpreterError("code must be a string")
        tools = dict(self.tools)
        bad_tools = [n for n in tools if not _valid_name(n) or n in RESERVED]
        if bad_tools:
            raise CodeInterpreterError(f"tool names must be Python identifiers: {bad_tools!r}")
        encoded = self._encode_variables(variables or {}, tools)
        if not self._started:
            self.start()
        self.streamed_chars = 0
        self._caller = contextvars.copy_context()
        names = {name: item.digest for name, item in encoded.items()}
        unsent = {i.digest: i.text for i in encoded.values() if i.digest not in self._sent}
        reply = self._send(code, names, unsent, list(tools))
        if reply.kind == "missing":
            everything = {i.digest: i.text for i in encoded.values()}
            reply = self._send(code, names, {d: everything[d] for d in reply.missing}, list(tools))
        self._sent.update(names.values())
        return self._outcome(reply)

    def _encode_variables(
        self, variables: dict[str, Any], tools: dict[str, Any]
    ) -> dict[str, _Encoded]:
        if not isinstance(variables, dict):
            raise CodeInterpreterError("variables must be a dict of names to values")
        bad = [n for n in variables if not _valid_name(n) or n in RESERVED or n in tools]
        if bad:
            raise CodeInterpreterError(
                "variable names must be Python identifiers distinct from tool names and "
                f"SUBMIT: {bad!r}"
            )
        encoded = {}
        memo: dict[int, _Encoded] = {}
        for name, value in variables.items():
            known = self._memo.get(id(value))
            if known is not None and known.value is value:
                memo[id(value)] = encoded[name] = known
                continue
            try:
                text = json.dumps(to_jsonable_python(value), allow_nan=False)
            except Exception as exc:  # pydantic and json both say why
                raise CodeInterpreterError(
                    f"variable {name!r} cannot be sent to the sandbox as JSON: {exc}"
                ) from exc
            item = _Encoded(value, text, hashlib.sha256(text.encode()).hexdigest())
            encoded[name] = item
            if isinstance(value, str | bytes | int | float | tuple | frozenset):
                memo[id(value)] = item  # immutable: identity means same content
        self._memo = memo
        return encoded

    def _send(
        self, code: str, names: dict[str, str], blobs: dict[str, str], tools: list[str]
    ) -> sb.ExecuteReply:
        inline = {d: text for d, text in blobs.items() if len(text) <= OFFLOAD_BYTES}
        try:
            # big values travel through the object store, not inside the request
            refs = {
                d: self.bus.put_blob(text.encode()) for d, text in blobs.items() if d not in inline
            }
        except Exception as exc:
            raise CodeInterpreterError(
                f"cannot stage a large variable in the object store: {_describe(exc)}"
            ) from exc
        request = sb.Execute(
            request_id=new_id(),
            tenant=self.bus.tenant,
            sandbox=self.sandbox,
            context=self.context,
            code=code,
            variables=names,
            blobs=inline,
            blob_refs=refs,
            tools=tools,
            output_fields=self.output_fields,
            wall_s=self.wall_s,
            callback_timeout_s=self.callback_timeout_s,
        )
        try:
            return self._await_cell(request)
        except CodeInterpreterError:
            self._terminal()
            raise
        except Exception as exc:
            self._terminal()
            # the context this interpreter opened is not there: lost between cells (the
            # broker started again and revived the sandbox in place, its memory gone)
            self.context_lost = isinstance(exc, rpc.RemoteError) and exc.code == NO_CONTEXT
            raise CodeInterpreterError(
                f"sandbox {self.sandbox} failed to run the cell: {_describe(exc)}"
            ) from exc

    def _await_cell(self, request: sb.Execute) -> sb.ExecuteReply:
        """Wait for the cell, checking every `liveness_s` that a broker still holds the
        sandbox and its REPL context: a cell can legitimately run for long (host tools
        excluded from its wall limit), but a dead broker replica, or one started again under
        the cell (the sandbox revived in place, its REPL memory gone), must not leave this
        thread waiting for an hour for a reply no one will send."""
        call = rpc.call_verb_reaching(
            self.bus.nc, verbs.EXECUTE, request, target=self.sandbox,
            timeout=self.request_timeout_s, reach_s=self.lost_after_s,
        )  # fmt: skip
        pending = self.bus.submit(call)
        unanswered_since: float | None = None
        while True:
            try:
                return pending.result(self.liveness_s)
            except concurrent.futures.TimeoutError:
                probe = sb.GetSandbox(
                    request_id=new_id(), tenant=self.bus.tenant, sandbox=self.sandbox
                )
                try:
                    info = self.bus.call(verbs.GET_SANDBOX, probe, target=self.sandbox, timeout=5)
                except (NoRespondersError, TimeoutError, NatsTimeout) as exc:
                    now = time.monotonic()
                    unanswered_since = unanswered_since or now
                    if now - unanswered_since < self.lost_after_s:
                        continue  # asked again: a broker restarting answers within the grace
                    pending.cancel()
                    raise CodeInterpreterError(
                        f"sandbox {self.sandbox} went away during the cell: {_describe(exc)}"
                    ) from exc
                unanswered_since = None
                if info.status != "running" or self.context not in info.contexts:
                    pending.cancel()
                    # running again without it: the broker started again under the cell and
                    # revived the sandbox in place (files kept, REPL memory gone)
                    self.context_lost = info.status == "running"
                    raise CodeInterpreterError(
                        f"sandbox {self.sandbox} was restarted during the cell (now "
                        f"{info.status}, without REPL context {self.context}): the cell's "
                        "result and the REPL state it ran in are lost; files are kept"
                    ) from None

    def _outcome(self, reply: sb.ExecuteReply) -> Any:
        match reply.kind:
            case "result":
                return reply.value if reply.value is not None else (reply.stdout or None)
            case "final":
                return FinalOutput(reply.value)
            case "syntax":
                raise SyntaxError(reply.error)
            case "error":
                raise CodeExecutionError(_with_output(reply.error, reply.stdout))
            case _:
                self._terminal()
                raise CodeInterpreterError(reply.error or "the sandbox stopped")

    def _terminal(self) -> None:
        with self._state_lock:
            self._ended = True
        self._close_inboxes()

    # -- tools -------------------------------------------------------------------------------

    def _on_tool(self, call: sb.ToolCall) -> sb.ToolReply:
        tool = self.tools.get(call.name)
        if tool is None:
            return sb.ToolReply(ok=False, error=f"Unknown tool: {call.name}")
        try:
            args, kwargs = tool_arguments(tool, call.args, call.kwargs)
        except TypeError as exc:
            return sb.ToolReply(ok=False, error=f"TypeError: {call.name}(): {exc}")
        try:
            result = self._caller.copy().run(tool, *args, **kwargs)
            if inspect.isawaitable(result):
                result = _await_in_sync(result)
            value = to_jsonable_python(result)
            json.dumps(value, allow_nan=False)
        except Exception as exc:
            return sb.ToolReply(ok=False, error=f"{type(exc).__name__}: {exc}")
        return sb.ToolReply(ok=True, value=value)


class RemoteInterpreterFactory:
    """What `dspy.RLM(interpreter_factory=...)` takes: each call is a new context on one
    sandbox. dspy reads `execution_instructions` from the factory, not the instance."""

    execution_instructions = EXECUTION_INSTRUCTIONS

    def __init__(self, bus: SandboxBus, sandbox: str, **options: Any) -> None:
        self.bus = bus
        self.sandbox = sandbox
        self.options = options

    def __call__(self) -> RemoteInterpreter:
        return RemoteInterpreter(self.bus, self.sandbox, **self.options)


def tool_arguments(
    tool: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """The arguments to call `tool` with, for a call sandbox code wrote as `args` and `kwargs`.

    dspy.RLM wraps each user tool as a keyword-only `invoke(**kwargs)` carrying the function's
    signature, so a positional call (`lookup("a")`) is bound to that signature and passed by
    name. Positional-only and variadic parameters stay positional; a tool with `*args` is
    called as written. A call that does not fit raises `TypeError` naming what is wrong
    ("missing a required argument: 'key'"). Without a signature to read, as written."""
    try:
        signature = inspect.signature(tool)
    except (TypeError, ValueError):
        return args, kwargs
    bound = signature.bind(*args, **kwargs)
    parameters = signature.parameters
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters.values()):
        return list(bound.args), dict(bound.kwargs)
    positional: list[Any] = []
    named: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        kind = parameters[name].kind
        if kind is inspect.Parameter.POSITIONAL_ONLY:
            positional.append(value)
        elif kind is inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        else:
            named[name] = value
    return positional, named


def _with_output(error: str, stdout: str) -> str:
    return f"{error}\nOutput before the error:\n{stdout}" if stdout else error


def _describe(exc: BaseException) -> str:
    if isinstance(exc, rpc.RemoteError):
        return f"{exc.code}: {exc.message}"
    if isinstance(exc, NoRespondersError):
        return "no broker replica holds this sandbox (it is gone or its broker restarted)"
    if isinstance(exc, TimeoutError | NatsTimeout):
        return "the broker did not answer in time"
    return f"{type(exc).__name__}: {exc}"
