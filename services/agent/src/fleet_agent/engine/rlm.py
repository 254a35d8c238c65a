"""The recursive engine: one `dspy.RLM` run over the mesh, every step in the run's record.

dspy 3.4.1 gives the RLM loop no hooks, so the record is taken at the three seams it does
have: the LMs (the budgeted LM hands each `LlmCalled` to the recorder), the action predictor
(wrapped, so each planned iteration is recorded with the call it was parsed from) and the
interpreter factory (each cell, and each host tool sandbox code calls, is recorded by the
interpreter that ran it). The loop itself is dspy's, unchanged.

Two of dspy's in-process limits are handed to the mesh instead:

- the sub-call counter (`max_llm_calls`): the prompt still states the tree's cap, but the
  count is the budget tree's, whose ledger sees every run of the tree. dspy's own counter sees
  one run only, so it would let a tree of children spend `max_llm_calls` each, and refuse with
  a message that names no budget;
- a `dspy.RLM` that sandbox code builds through dspy's facade: dspy would run it on this host
  with a fresh REPL context and no run of its own (no record, no isolation policy, no depth
  limit). It is refused with a message that names `sub_rlm`, the host tool that makes the same
  request a real child run.
"""

import contextlib
import inspect
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import dspy
import msgspec
from dspy.primitives.code_interpreter import (
    CodeExecutionError,
    CodeInterpreterError,
    FinalOutput,
)
from dspy.primitives.facade import CONSTRUCT_TOOL
from pydantic_core import to_jsonable_python

from fleet_agent.engine.children import ChildRuns
from fleet_agent.engine.journal_lm import journal_lm
from fleet_agent.engine.model import (
    RlmResult,
    RlmTask,
    RunCancelledError,
    RunContext,
    RunFenced,
    derived_id,
    in_own_thread,
)
from fleet_agent.engine.recorder import INLINE_BYTES, TOOL_CALL, RunRecorder
from fleet_agent.engine.resume import Resume, load_journal, recorded_answer
from fleet_agent.interpreter import EXECUTION_INSTRUCTIONS, RemoteInterpreter
from fleet_agent.llm_failures import LLM_FAILURES
from fleet_agent.lm import CallScope, PendingUsage, budgeted_lm, failure_of
from fleet_agent.runners import stated_failure
from fleet_agent.sandbox_bus import SandboxBus
from fleet_events import bus as verbs
from fleet_events import new_id
from fleet_events import sandbox as sb
from fleet_events.budget import CLIENT_DEADLINE_S
from fleet_events.journal import Journal, RecordedCell
from fleet_events.run import (
    CellExecuted,
    IterationPlanned,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunResumed,
    RunStarted,
    ToolCalled,
    ToolReturned,
)
from fleet_events.subjects import live as live_subject
from fleet_mesh import rpc

log = logging.getLogger("fleet.agent.engine")

UNCOUNTED = 1_000_000
"""dspy's own sub-call counter is set past reach: the budget tree counts (module docstring)."""

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

SANDBOX_LOST = (
    "this run's sandbox is gone and its REPL state with it: the recorded cells cannot be "
    "continued; ask again"
)

HOST_TOOL_MARGIN_S = 30.0
"""How much longer than the tree's deadline the broker relays a host tool call: a `sub_rlm`
that meets the deadline reaps its child and records why, and the code must get that answer
("no answer before the tree's deadline"), not the relay's own bare timeout."""

CHILD_SETTLE_S = 90.0
"""How long a run's end waits for sub_rlm calls its interrupted cells left running (a child
records its own end within the cancel grace, and the call then records the parent's side)."""


def _preview(value: Any) -> Any:
    """A JSON-safe copy of `value` for the record (pydantic inputs, History...)."""
    try:
        return to_jsonable_python(value, fallback=str)
    except Exception:  # anything that cannot be shown is recorded by its type
        return f"<{type(value).__name__}>"


class RunHooks:
    """What the recording seams share: the recorder, the cancel flag, and the loop's position."""

    def __init__(self, ctx: RunContext, recorder: RunRecorder, resume: Resume) -> None:
        self.ctx = ctx
        self.recorder = recorder
        self.resume = resume
        self.iteration: int | None = None
        self.iterations = 0
        self.last_reasoning = ""
        self._interrupts: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def boundary(self, iteration: int | None) -> None:
        """A step boundary: stop here once the run is cancelled."""
        if self.ctx.cancel.is_set:
            raise RunCancelledError(self.ctx.cancel.reason)
        if iteration is not None:
            self.iteration = iteration
            self.iterations = iteration + 1

    def planned(self, reasoning: str, code: str) -> None:
        self.last_reasoning = reasoning
        self.recorder.record(
            IterationPlanned(
                index=self.iteration or 0,
                reasoning=reasoning,
                code=code,
                llm_call=self.recorder.last_step_call,
            )
        )


class _Planned:
    """Stands in for RLM's action predictor: the same call, then the plan recorded."""

    def __init__(self, predict: Any, hooks: RunHooks) -> None:
        self.predict = predict
        self.hooks = hooks

    @property
    def signature(self) -> Any:
        return self.predict.signature

    def __call__(self, **kwargs: Any) -> Any:
        prediction = self.predict(**kwargs)
        self.hooks.planned(str(prediction.reasoning or ""), str(prediction.code or ""))
        return prediction


class RecordedRLM(dspy.RLM):  # type: ignore[misc]  # dspy ships no types
    def __init__(self, signature: str, *, hooks: RunHooks, **options: Any) -> None:
        super().__init__(signature, **options)
        self._hooks = hooks
        self.generate_action: Any = _Planned(self.generate_action, hooks)
        self.max_llm_calls = UNCOUNTED  # the prompt keeps the tree's cap: it was built above

    def _execute_iteration(
        self, repl: Any, variables: Any, history: Any, iteration: int, *rest: Any
    ) -> Any:
        self._hooks.boundary(iteration)
        return super()._execute_iteration(repl, variables, history, iteration, *rest)

    def _extract_fallback(self, *args: Any) -> Any:
        self._hooks.boundary(None)
        return super()._extract_fallback(*args)


class RecordingInterpreter(RemoteInterpreter):
    """A REPL context whose every cell and host tool call is recorded on the run."""

    def __init__(self, bus: SandboxBus, sandbox: str, *, hooks: RunHooks, **options: Any) -> None:
        super().__init__(bus, sandbox, **options)
        self._hooks = hooks
        self._reply: sb.ExecuteReply | None = None
        self._cell_done = threading.Event()

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
            return super().execute(code, variables)
        except (CodeExecutionError, SyntaxError, CodeInterpreterError) as exc:
            error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self._cell_done.set()
            release()
            recorder.current_cell = outer
            self._record_cell(cell, code, error, (time.monotonic() - started) * 1000)

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
            final = _preview(reply.value)
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
        args = {"args": _preview(call.args), "kwargs": _preview(call.kwargs)}
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


# -- the run -------------------------------------------------------------------------------


async def run_rlm(
    task: RlmTask, ctx: RunContext, *, tools: list[Callable[..., Any]] | None = None
) -> RlmResult:
    """Run `task` as the RLM run `ctx.run` on `ctx.sandbox`, charged to `ctx.tree`.

    Records `run.started`, every step, and exactly one of `run.completed`, `run.failed` or
    `run.cancelled` (unless the run was fenced: another holder owns its record, and this
    replica writes nothing more). Never raises for what the run did; the result says how it
    ended. The caller opens and closes the tree, and owns the sandbox.
    """
    loaded = await ctx.mesh.on_bus(load_journal(ctx))
    journal = loaded.journal
    if journal.ended is not None:
        return _from_record(journal, loaded.head.hash)
    recorder = RunRecorder(ctx, journal, loaded.head)
    resume = Resume(ctx, journal)
    hooks = RunHooks(ctx, recorder, resume)
    children = ChildRuns(task, ctx, recorder, resume)
    try:
        if resume.active:
            lost = _sandbox_lost(journal, ctx)
            if lost:
                failed = RunFailed(error=lost, reason="sandbox_lost", retryable=True)
                return await _end(recorder, hooks, failed, status="failed", error=lost, retry=True)
            if journal.cell_in_flight:
                await _move_to_fork(ctx)
            await recorder.arecord(_resumed(journal, ctx))
        await recorder.arecord(_started(task, ctx))
        offered = [*(tools or []), *children.tools()]
        try:
            prediction = await in_own_thread(_forward, task, ctx, hooks, offered)
        finally:
            # an interrupted cell leaves its tool call running: its child events come first
            await in_own_thread(children.idle, CHILD_SETTLE_S)
    except RunFenced as exc:
        log.warning("run fenced: recording nothing more", extra={"run": ctx.run, "why": str(exc)})
        return RlmResult(status="failed", error=str(exc), retryable=True, fenced=True)
    except RunCancelledError:
        partial = hooks.last_reasoning
        return await _end(
            recorder,
            hooks,
            RunCancelled(reason=ctx.cancel.reason, partial_answer=partial),
            status="cancelled",
            answer=partial,
        )
    except Exception as exc:
        log.exception("rlm run failed", extra={"run": ctx.run})
        failure = failure_of(exc)
        if failure is not None:  # a model call ended it: its kind, and what to do about it
            failed = RunFailed(
                error=failure.message, reason=failure.code, retryable=failure.retryable
            )
            return await _end(
                recorder, hooks, failed, status="failed", error=failure.message,
                retry=failure.retryable, code=failure.code,
            )  # fmt: skip
        stated = stated_failure(exc)
        if stated is not None:  # e.g. the session's repository could not be cloned
            failed = RunFailed(error=stated.error, reason=stated.code, retryable=stated.retryable)
            return await _end(
                recorder, hooks, failed, status="failed", error=stated.error,
                retry=stated.retryable, code=stated.code,
            )  # fmt: skip
        error = f"{type(exc).__name__}: {exc}"[:2000]
        return await _end(
            recorder,
            hooks,
            RunFailed(error=error, reason=type(exc).__name__, retryable=False),
            status="failed",
            error=error,
        )
    outputs = {name: _preview(getattr(prediction, name)) for name in _output_names(task)}
    answer = str(getattr(prediction, task.answer_field, "") or "")
    completed = RunCompleted(
        answer=answer, outputs=outputs, iterations=hooks.iterations, llm_calls=recorder.llm_calls
    )
    return await _end(
        recorder, hooks, completed, status="completed", answer=answer, outputs=outputs
    )


def _from_record(journal: Journal, head: str) -> RlmResult:
    """A run whose record already ends (its holder died after the end, before its caller
    recorded it): the recorded end, nothing run again."""
    end = journal.ended
    calls = len(journal.calls)
    iterations = len(journal.plans)
    if isinstance(end, RunCompleted):
        return RlmResult(
            status="completed", answer=end.answer, outputs=end.outputs, head_hash=head,
            iterations=end.iterations, llm_calls=end.llm_calls,
        )  # fmt: skip
    if isinstance(end, RunCancelled):
        return RlmResult(
            status="cancelled", answer=end.partial_answer, head_hash=head, llm_calls=calls,
            iterations=iterations,
        )  # fmt: skip
    error = end.error if isinstance(end, RunFailed) else "the run ended"
    retryable = end.retryable if isinstance(end, RunFailed) else False
    reason = end.reason if isinstance(end, RunFailed) else ""
    return RlmResult(
        status="failed", error=error, head_hash=head, retryable=retryable, llm_calls=calls,
        iterations=iterations, code=reason if reason in LLM_FAILURES else "",
    )  # fmt: skip


def _sandbox_lost(journal: Journal, ctx: RunContext) -> str:
    """Why the record cannot be continued here ("" when it can): its cells made REPL state
    in a sandbox this attempt does not have."""
    if not ctx.sandbox:
        return SANDBOX_LOST
    if not journal.cells or not journal.sandbox:
        return ""
    return "" if journal.sandbox == ctx.sandbox else SANDBOX_LOST


async def _move_to_fork(ctx: RunContext) -> None:
    """The dead holder's cell may still be running in the run's REPL context (blocked on a
    host tool whose caller is gone, or mid-computation): the run goes on in a fork of its
    sandbox, which holds the REPL state as of the last completed cell, and the old sandbox is
    left to its owner (`ctx.on_fork`) or to the run's reaper. Interrupting the old cell in
    place is not used: after an interrupt the local runner spins on the next SUBMIT (seen
    here; docs/turns.md, "Not done yet"). A fork that fails leaves the run where it was."""
    request = sb.ForkSandbox(
        request_id=derived_id("resume-fork", ctx.run, str(ctx.attempt)), tenant=ctx.tenant,
        sandbox=ctx.sandbox, labels={"session": ctx.session, "run": ctx.run, "role": "resumed"},
    )  # fmt: skip
    call = rpc.call_verb(
        ctx.mesh.bus.nc, verbs.FORK_SANDBOX, request, target=ctx.sandbox, timeout=60
    )
    try:
        info = await ctx.mesh.on_bus(call)
    except Exception:
        log.warning("resume: no fork of the run's sandbox", exc_info=True, extra={"run": ctx.run})
        return
    old, ctx.sandbox = ctx.sandbox, info.sandbox
    if ctx.on_fork is not None:
        await ctx.on_fork(old, info)


def _resumed(journal: Journal, ctx: RunContext) -> RunResumed:
    return RunResumed(
        attempt=ctx.attempt, replica=ctx.mesh.actor.replica, reused_calls=len(journal.calls),
        reused_cells=len(journal.cells), in_flight=journal.in_flight, sandbox=ctx.sandbox,
    )  # fmt: skip


def _started(task: RlmTask, ctx: RunContext) -> RunStarted:
    return RunStarted(
        kind="rlm", tree=ctx.tree, depth=ctx.depth, task=str(task.inputs.get("task", ""))[:2000],
        signature=task.signature, inputs=_preview(task.inputs), max_iters=task.max_iters,
        max_llm_calls=task.max_llm_calls, sandbox=ctx.sandbox, parent_call=ctx.parent_call,
    )  # fmt: skip


async def _end(
    recorder: RunRecorder,
    hooks: RunHooks,
    event: Any,
    *,
    status: str,
    retry: bool = False,
    **fields: Any,
) -> RlmResult:
    try:
        head = await recorder.arecord(event)
    except RunFenced as exc:
        return RlmResult(status="failed", error=str(exc), retryable=True, fenced=True)
    return RlmResult(
        status=status, iterations=hooks.iterations, llm_calls=recorder.llm_calls,
        head_hash=head.hash, retryable=retry, **fields,
    )  # fmt: skip


def _output_names(task: RlmTask) -> list[str]:
    return list(dspy.Signature(task.signature).output_fields)


def _forward(
    task: RlmTask, ctx: RunContext, hooks: RunHooks, tools: list[Callable[..., Any]]
) -> Any:
    """dspy's synchronous loop, in a thread of its own (it blocks on the bus for every step)."""
    recorder = hooks.recorder
    mesh = ctx.mesh
    usage = PendingUsage(mesh.bus.submit, timeout_s=CLIENT_DEADLINE_S + 5)

    def lm(role: str, kind: Any) -> Any:
        scope = CallScope(tenant=ctx.tenant, tree=ctx.tree, run=ctx.run, role=role, kind=kind)
        # the root's own steps stream an answer field (dspy's extract step) to the session as
        # `assistant_token` deltas; a child's answer is its parent's business, not the user's
        streams = ctx.depth == 0 and kind == "step"
        budgeted = budgeted_lm(
            mesh.bus, mesh.lm, scope, on_call=recorder.on_llm_call,
            on_delta=recorder.live if streams else None, grant_id=recorder.next_grant_id,
            run_deadline=ctx.deadline, usage=usage,
        )  # fmt: skip
        return journal_lm(budgeted, hooks.resume, recorder) if hooks.resume.active else budgeted

    # what cells print goes live while they run (`cell_output` deltas), not only at their end
    options: dict[str, Any] = {"live": (live_subject(ctx.tenant, ctx.session), ctx.run)}
    if task.cell_wall_s is not None:
        options["wall_s"] = task.cell_wall_s
    rlm = RecordedRLM(
        task.signature,
        hooks=hooks,
        max_iters=task.max_iters,
        max_llm_calls=task.max_llm_calls,
        max_output_chars=task.max_output_chars,
        sub_lm=lm(task.delegate_role, "sub"),
        tools=tools,
        interpreter_factory=RecordingFactory(hooks, **options),
    )
    adapter = dspy.ChatAdapter(use_json_adapter_fallback=False)
    try:
        with dspy.context(lm=lm(task.planner_role, "step"), adapter=adapter):
            answer = rlm(**task.inputs)
    except BaseException:
        _settle_quietly(usage)  # the run's own error is the one to report
        raise
    usage.settle()  # the run ends once the ledger holds every call's usage
    return answer


def _settle_quietly(usage: PendingUsage) -> None:
    """Wait for the reports of a run that failed: they are still owed to the ledger, but a
    report's failure must not hide why the run ended."""
    try:
        usage.settle()
    except Exception:
        log.warning("a usage report of a failed run could not be recorded", exc_info=True)
