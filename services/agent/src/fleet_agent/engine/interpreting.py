"""The RLM's interpreter on the mesh, recorded: every cell a run's REPL context runs, and every
host tool call sandbox code makes, appended to the run's record by the interpreter that ran it
(the third of the engine's recording seams: `engine.rlm`).

A resumed run's cells that the record holds are answered from it without running (`Resume`);
its first live cell in a context first stops what the dead holder left running there. A cancel
interrupts the running cell (the REPL survives). A `dspy.RLM` that sandbox code builds through
dspy's facade is refused here (`FACADE_RLM_REFUSED`).

A context lost under a cell (its broker SIGKILLed and started again: the sandbox is revived,
its files kept, its REPL memory gone: `context_lost`) is rebuilt: opened again, the cells it ran
replayed in order with their host tool calls answered with what they answered the first time
(no model call asked again, no tool run again), each replay's output compared with the first
run's, then the interrupted cell runs again, its host calls made before the loss answered the
same way. A replay that prints or answers otherwise (code that reads a clock or a random
number) fails the cell as before, saying so. A cell therefore runs at least once.
"""

import contextlib
import inspect
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from dspy.primitives.code_interpreter import (
    CodeExecutionError,
    CodeInterpreterError,
    FinalOutput,
)
from dspy.primitives.facade import CONSTRUCT_TOOL
from pydantic_core import to_jsonable_python

from fleet_agent.engine.hooks import RunHooks
from fleet_agent.engine.model import RunCancelledError, RunContext, derived_id
from fleet_agent.engine.recorder import INLINE_BYTES, TOOL_CALL
from fleet_agent.engine.resume import recorded_answer
from fleet_agent.interpreter import EXECUTION_INSTRUCTIONS, RemoteInterpreter
from fleet_agent.sandbox_bus import SandboxBus
from fleet_events import bus as verbs
from fleet_events import new_id
from fleet_events import sandbox as sb
from fleet_events.journal import RecordedCell
from fleet_events.run import CellExecuted, ToolCalled, ToolReturned

LLM_TOOLS = frozenset({"llm_query", "llm_query_batched"})
"""Recorded as `run.llm_called` (with the cell in flight), not again as tool calls."""

REFUSED_FACADE = frozenset({"RLM"})

FACADE_RLM_REFUSED = (
    "dspy.RLM cannot be built inside the sandbox here: it would run outside the tree's child-run "
    "policy and record. Call sub_rlm(task) (or sub_rlm_batched(tasks)) for a recursive sub-task, "
    "or use dspy.Predict / dspy.ChainOfThought for a single step."
)

STDOUT_INLINE = 8 * 1024

INTERRUPT_EVERY_S = 1.0
INTERRUPT_TRIES = 30

CLEAR_TRIES = 100
CLEAR_EVERY_S = 0.05
"""A resumed run's first live cell in a context first stops what the dead holder left running
there: interrupts until the broker says nothing runs (bounded: 5 s)."""

HOST_TOOL_MARGIN_S = 30.0
"""How much longer than the tree's deadline the broker relays a host tool call: a `sub_rlm`
that meets the deadline reaps its child and records why, and the code must get that answer
("no answer before the tree's deadline"), not the relay's own bare timeout."""


REBUILDS = 2
"""Rebuilds of a lost context per cell: a broker that keeps dying fails the cell."""
REBUILD_KEEP_CHARS = 16 * 1024 * 1024
"""What a context keeps to rebuild itself (code, output and host answers of its cells): past
it, a lost context is not rebuilt (the cell fails, saying so)."""

log = logging.getLogger(__name__)


@dataclass
class _Ran:
    """A cell this context ran, kept to replay it: what it was sent and what it answered."""

    cell: str
    code: str
    variables: dict[str, Any] | None
    answer: tuple[str, str, Any]
    """(kind, stdout, value) of the sandbox's reply."""
    tools: list[tuple[str, sb.ToolReply]] = field(default_factory=list)
    """Its host tool calls in order: (tool name, what the host answered)."""


def _answer_of(reply: sb.ExecuteReply | None) -> tuple[str, str, Any]:
    if reply is None:
        return ("none", "", None)
    return (reply.kind, reply.stdout, reply.value)


def _weight(ran: _Ran) -> int:
    tools = sum(len(str(r.value)) + len(r.error) for _, r in ran.tools)
    return len(ran.code) + len(ran.answer[1]) + len(str(ran.answer[2])) + tools


def preview(value: Any) -> Any:
    """A JSON-safe copy of `value` for the record (pydantic inputs, History...)."""
    try:
        return to_jsonable_python(value, fallback=str)
    except Exception:  # anything that cannot be shown is recorded by its type
        return f"<{type(value).__name__}>"


class RecordingInterpreter(RemoteInterpreter):
    """A REPL context whose every cell and host tool call is recorded on the run."""

    def __init__(self, bus: SandboxBus, sandbox: str, *, hooks: RunHooks, **options: Any) -> None:
        super().__init__(bus, sandbox, **options)
        self._hooks = hooks
        self._reply: sb.ExecuteReply | None = None
        self._cell_done = threading.Event()
        self._ran: list[_Ran] = []
        self._kept = 0
        self._from_record = False
        self._calls: list[tuple[str, sb.ToolReply]] = []
        """The running cell's host tool calls so far, as `_Ran.tools`."""
        self._answers: deque[tuple[str, sb.ToolReply]] = deque()
        """Host calls answered from what they answered before (a replay, or a cell run again)."""
        self._diverged = ""
        self._replaying = False
        """Replaying a kept cell: every host call is answered from memory, none made live."""
        self._tools_lock = threading.Condition()
        self._in_tools = 0

    def execute(self, code: str, variables: dict[str, Any] | None = None) -> Any:
        recorder = self._hooks.recorder
        cell, recorded = recorder.next_cell(code if isinstance(code, str) else "")
        if recorded is not None:
            return self._recorded(recorded)
        if self._hooks.resume.first_live_in(self.context):
            self._clear_context()
        outer, recorder.current_cell = recorder.current_cell, cell
        self._reply = None
        self._cell_done = threading.Event()
        if self._hooks.ctx.deadline is not None:  # host tools wait on children up to it
            left = max(1.0, self._hooks.ctx.deadline - time.time())
            self.callback_timeout_s = left + HOST_TOOL_MARGIN_S
        release = self._hooks.ctx.cancel.on_set(self._interrupt)
        if self._hooks.ctx.cancel.is_set:  # set before the cell began: it never runs
            release()
            recorder.current_cell = outer
            raise RunCancelledError(self._hooks.ctx.cancel.reason)
        started = time.monotonic()
        error = ""
        try:
            return self._run_cell(code, variables)
        except (CodeExecutionError, SyntaxError, CodeInterpreterError) as exc:
            error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self._cell_done.set()
            release()
            recorder.current_cell = outer
            self._record_cell(cell, code, error, (time.monotonic() - started) * 1000)

    def _run_cell(self, code: str, variables: dict[str, Any] | None) -> Any:
        """The cell on the sandbox; a context lost under it is rebuilt and the cell run again
        (module docstring). A cell that ran (whatever it answered) is kept for a rebuild."""
        with self._tools_lock:
            self._calls, self._answers = [], deque()
        for rebuilt in range(REBUILDS + 1):
            try:
                value = super().execute(code, variables)
            except CodeInterpreterError as lost:
                if not self.context_lost or rebuilt == REBUILDS or not self._rebuildable:
                    raise
                self._rebuild(lost)
                continue
            except (CodeExecutionError, SyntaxError):
                self._keep(code, variables)
                raise
            self._keep(code, variables)
            return value
        raise AssertionError("unreachable: the last rebuild raises")

    def _keep(self, code: str, variables: dict[str, Any] | None) -> None:
        with self._tools_lock:
            ran = _Ran(
                self._hooks.recorder.current_cell, code, variables, _answer_of(self._reply),
                self._calls,
            )  # fmt: skip
        self._ran.append(ran)
        self._kept += _weight(ran)

    @property
    def _rebuildable(self) -> bool:
        """Every cell of the context is kept: none answered from a dead holder's record (its
        host answers are not here), and not more than `REBUILD_KEEP_CHARS` of them."""
        return not self._from_record and self._kept <= REBUILD_KEEP_CHARS

    def _rebuild(self, lost: Exception) -> None:
        """Open the lost context again and replay the cells it ran; the interrupted cell's
        host calls made so far are answered again when it runs again."""
        with self._tools_lock:  # the lost attempt's host calls finish first: they are reused
            if not self._tools_lock.wait_for(lambda: self._in_tools == 0, self.callback_timeout_s):
                raise lost
            interrupted = self._calls
        log.warning(
            "REPL context lost under a cell: rebuilding it",
            extra={"sandbox": self.sandbox, "context": self.context, "cells": len(self._ran)},
        )
        try:
            self._reopen()
        except CodeInterpreterError as exc:
            raise CodeInterpreterError(f"{lost}; opening it again failed: {exc}") from exc
        for n, ran in enumerate(self._ran, start=1):
            with self._tools_lock:
                self._calls, self._answers, self._diverged = [], deque(ran.tools), ""
                self._replaying = True
            self._reply = None
            try:
                with contextlib.suppress(CodeExecutionError, SyntaxError):
                    super().execute(ran.code, ran.variables)
            finally:
                with self._tools_lock:
                    self._replaying = False
            got = _answer_of(self._reply)
            if got != ran.answer or self._diverged or self._answers:
                why = self._diverged or (
                    f"it answered {got[0]} {got[1][:200]!r}, the first run {ran.answer[0]} "
                    f"{ran.answer[1][:200]!r}"
                )
                self._terminal()
                self._reply = None  # the failed cell's record is its own, not the replay's
                raise CodeInterpreterError(
                    f"{lost}. Rebuilding the context failed at cell {ran.cell} ({n} of "
                    f"{len(self._ran)} replayed): {why}. A cell that reads a clock, a random "
                    "number or a file changed since gives other output when replayed: ask again"
                ) from None
        self._relay_live()
        with self._tools_lock:
            self._calls, self._answers = [], deque(interrupted)

    def shutdown(self) -> None:
        """A fenced run's context belongs to the holder that took the run over: only this
        interpreter's inbox goes (closing the context would pull it from under that holder)."""
        if self._hooks.recorder.fenced:
            self._terminal()
            return
        super().shutdown()

    def _recorded(self, cell: RecordedCell) -> Any:
        """A cell the record holds: its answer, as the sandbox gave it, without running it."""
        resume = self._hooks.resume
        resume.reuse_cell()
        self._from_record = True
        if cell.iteration is not None:
            self._hooks.iteration = cell.iteration
        outcome, value = recorded_answer(resume, cell)
        match outcome:
            case "final":
                return FinalOutput(value)
            case "result":
                return value
            case "syntax":
                raise SyntaxError(value)
            case "error":
                raise CodeExecutionError(value)
        raise CodeInterpreterError(value)

    def _clear_context(self) -> None:
        """Stop the cell the last holder left running in this context (its REPL state is what
        the recorded cells made; the cell itself is the step in flight, and runs again)."""
        for _ in range(CLEAR_TRIES):
            request = sb.InterruptCell(
                request_id=new_id(), tenant=self.bus.tenant, sandbox=self.sandbox,
                context=self.context,
            )  # fmt: skip
            try:
                answer = self.bus.call(
                    verbs.INTERRUPT_CELL, request, target=self.sandbox, timeout=10
                )
            except Exception:  # no such context yet, or the sandbox is gone: nothing runs
                return
            if not answer.interrupted:
                return
            self._cell_done.wait(CLEAR_EVERY_S)

    def _record_cell(self, cell: str, code: str, error: str, duration_ms: float) -> None:
        reply = self._reply
        stdout = reply.stdout if reply is not None else ""
        final = None
        if reply is not None and reply.kind == "final" and isinstance(reply.value, dict):
            final = preview(reply.value)
        value = None
        kept = reply is not None and reply.kind == "result" and reply.value is not None
        if kept and reply is not None and len(_json_bytes(reply.value)) <= INLINE_BYTES:
            value = reply.value
        blob = None
        if len(stdout.encode()) > STDOUT_INLINE:
            blob = self.bus.put_blob(stdout.encode())
            stdout = stdout[:STDOUT_INLINE]
        rest = stdout[self.streamed_chars :]  # what was not streamed while the cell ran
        if rest:
            self._hooks.recorder.live("cell_output", rest)
        self._hooks.recorder.record(
            CellExecuted(
                code=code if len(code.encode()) <= INLINE_BYTES else code[:INLINE_BYTES],
                stdout=stdout,
                error=error,
                duration_ms=round(duration_ms, 3),
                cell_id=cell,
                iteration=self._hooks.iteration,
                final=final,
                sandbox=self.sandbox,
                context=self.context,
                stdout_blob=blob,
                outcome=_outcome_kind(reply, error),
                value=value,
                setup=self._hooks.iteration is None,
            )
        )

    def _outcome(self, reply: sb.ExecuteReply) -> Any:
        self._reply = reply
        return super()._outcome(reply)

    def _interrupt(self) -> None:
        """Stop the cell now (the cancel flag was set while it ran); the REPL survives.

        Sent again every `INTERRUPT_EVERY_S` until the cell has answered: a cancel that lands
        between the flag check and the cell's start finds nothing running the first time."""
        done = self._cell_done

        def keep_interrupting() -> None:
            for _ in range(INTERRUPT_TRIES):
                request = sb.InterruptCell(
                    request_id=new_id(), tenant=self.bus.tenant, sandbox=self.sandbox,
                    context=self.context,
                )  # fmt: skip
                with contextlib.suppress(Exception):  # a gone sandbox: nothing to stop
                    self.bus.call(verbs.INTERRUPT_CELL, request, target=self.sandbox, timeout=10)
                if done.wait(INTERRUPT_EVERY_S):
                    return

        threading.Thread(target=keep_interrupting, daemon=True, name="interrupt").start()

    def _on_tool(self, call: sb.ToolCall) -> sb.ToolReply:
        with self._tools_lock:
            if self._replaying:  # a kept cell: answered as before, never made live
                reply = self._replayed(call.name)
                self._calls.append((call.name, reply))
                return reply
            if self._answers and self._answers[0][0] == call.name:
                # the interrupted cell run again: its calls made before the loss, as answered
                name, reply = self._answers.popleft()
                self._calls.append((name, reply))
                return reply
            self._answers.clear()  # it went another way: from here on its calls are live
            self._in_tools += 1
        try:
            reply = self._live_tool(call)
        finally:
            with self._tools_lock:
                self._in_tools -= 1
                self._tools_lock.notify_all()
        with self._tools_lock:
            self._calls.append((call.name, reply))
        return reply

    def _replayed(self, name: str) -> sb.ToolReply:
        """The next kept answer of the cell being replayed; a call it did not make the first
        time marks the replay diverged and is refused (nothing is asked live in a replay)."""
        if self._answers and self._answers[0][0] == name:
            return self._answers.popleft()[1]
        first = f"{self._answers[0][0]}()" if self._answers else "nothing more"
        self._diverged = self._diverged or f"it called {name}() where the first run called {first}"
        return sb.ToolReply(ok=False, error="replay diverged: " + self._diverged)

    def _live_tool(self, call: sb.ToolCall) -> sb.ToolReply:
        if call.name == CONSTRUCT_TOOL and _facade_kind(call) in REFUSED_FACADE:
            return sb.ToolReply(ok=False, error=FACADE_RLM_REFUSED)
        if call.name in LLM_TOOLS:
            return super()._on_tool(call)
        recorder = self._hooks.recorder
        call_id = recorder.next_tool_call(recorder.current_cell or self.context)
        call = msgspec.structs.replace(call, request_id=call_id)
        done = self._hooks.resume.tool(call_id)
        if done is not None:  # returned before the last holder died: its answer stands
            return sb.ToolReply(ok=not done.error, value=done.result, error=done.error)
        TOOL_CALL.current = (call_id, self.context)
        try:
            return self._recorded_tool(self._by_name(call))
        finally:
            TOOL_CALL.current = None

    def _by_name(self, call: sb.ToolCall) -> sb.ToolCall:
        """dspy wraps user tools as keyword-only `invoke(**kwargs)` (with the function's
        signature attached), and sandbox code calls them positionally: bind the arguments to
        their names here, so `sub_rlm_batched(tasks)` reaches the tool as `tasks=...`."""
        tool = self.tools.get(call.name)
        if tool is None or not call.args:
            return call
        named = _keywords(tool, call)
        return call if isinstance(named, str) else named

    def _recorded_tool(self, call: sb.ToolCall) -> sb.ToolReply:
        recorder = self._hooks.recorder
        cell = recorder.current_cell
        args = {"args": preview(call.args), "kwargs": preview(call.kwargs)}
        recorder.record(
            ToolCalled(
                call_id=call.request_id, tool=call.name, args=args, source="sandbox", cell=cell
            )
        )
        started = time.monotonic()
        reply = super()._on_tool(call)
        recorder.record(
            ToolReturned(
                call_id=call.request_id,
                tool=call.name,
                result=reply.value if reply.ok else None,
                error=reply.error or "",
                duration_ms=round((time.monotonic() - started) * 1000, 3),
            )
        )
        return reply


def _json_bytes(value: Any) -> bytes:
    try:
        return msgspec.json.encode(value)
    except (TypeError, msgspec.EncodeError):
        return b"x" * (INLINE_BYTES + 1)  # not JSON: not kept inline


def _outcome_kind(reply: sb.ExecuteReply | None, error: str) -> str:
    if reply is None:
        return "terminal" if error else "result"
    return reply.kind if reply.kind in ("result", "final", "syntax", "error") else "terminal"


def run_context(ctx: RunContext) -> str:
    """The REPL context of the run's own interpreter: a child's from `build_child`, else one
    fixed by the run id, so a resumed attempt re-attaches to the context its cells made."""
    return ctx.context or derived_id("repl", ctx.run)


def _keywords(tool: Callable[..., Any], call: sb.ToolCall) -> sb.ToolCall | str:
    try:
        bound = inspect.signature(tool).bind(*call.args, **call.kwargs)
    except TypeError as exc:
        return f"{call.name}: {exc}"
    return msgspec.structs.replace(call, args=[], kwargs=dict(bound.arguments))


def _facade_kind(call: sb.ToolCall) -> object:
    return call.kwargs.get("kind", call.args[0] if call.args else None)


class RecordingFactory:
    """`interpreter_factory` for the run: each call a new recorded context on the run's sandbox."""

    execution_instructions = EXECUTION_INSTRUCTIONS

    def __init__(self, hooks: RunHooks, **options: Any) -> None:
        self.hooks = hooks
        self.options = options
        self._first = True

    def __call__(self) -> RecordingInterpreter:
        """The run's own interpreter opens the run's context (a child's, from `build_child`);
        nested ones (facade sub-agents) get fresh contexts on the same sandbox."""
        ctx = self.hooks.ctx
        context, self._first = (run_context(ctx) if self._first else None), False
        return RecordingInterpreter(
            ctx.mesh.bus, ctx.sandbox, hooks=self.hooks, context=context, **self.options
        )


__all__ = [
    "FACADE_RLM_REFUSED",
    "HOST_TOOL_MARGIN_S",
    "RecordingFactory",
    "RecordingInterpreter",
    "preview",
    "run_context",
]
