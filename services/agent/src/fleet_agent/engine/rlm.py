"""The recursive engine: one `dspy.RLM` run over the mesh, every step in the run's record.

dspy 3.4.1 gives the RLM loop no hooks, so the record is taken at the three seams it does
have: the LMs (the budgeted LM hands each `LlmCalled` to the recorder), the action predictor
(wrapped, so each planned iteration is recorded with the call it was parsed from) and the
interpreter factory (each cell, and each host tool sandbox code calls, is recorded by the
interpreter that ran it: `engine.interpreting`). The loop itself is dspy's, unchanged. How the
run begins (fresh, taken over from its record, or read from a record that ends) and the one
terminal event it appends are the run kernel's lifecycle (`run.lifecycle`), the chat runner's
too.

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

import logging
from collections.abc import Callable
from typing import Any

import dspy

from fleet_agent.engine.children import ChildRuns
from fleet_agent.engine.hooks import RunHooks
from fleet_agent.engine.interpreting import FACADE_RLM_REFUSED, RecordingFactory, preview
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
from fleet_agent.engine.recorder import RunRecorder
from fleet_agent.engine.resume import Resume, load_journal
from fleet_agent.lm import CallScope, PendingUsage, budgeted_lm
from fleet_agent.run import lifecycle
from fleet_agent.run.failures import NO_SUBMIT, RunFailure
from fleet_agent.run.seams import Predictor
from fleet_events import bus as verbs
from fleet_events import sandbox as sb
from fleet_events.budget import CLIENT_DEADLINE_S
from fleet_events.journal import Journal
from fleet_events.run import RunStarted
from fleet_events.subjects import live as live_subject
from fleet_mesh import rpc

log = logging.getLogger("fleet.agent.engine")

UNCOUNTED = 1_000_000
"""dspy's own sub-call counter is set past reach: the budget tree counts (module docstring)."""

SANDBOX_LOST = (
    "this run's sandbox is gone and its REPL state with it: the recorded cells cannot be "
    "continued; ask again"
)

CHILD_SETTLE_S = 90.0
"""How long a run's end waits for sub_rlm calls its interrupted cells left running (a child
records its own end within the cancel grace, and the call then records the parent's side)."""


def no_submit_message(max_iters: int) -> str:
    return (
        f"the RLM used all {max_iters} of its iterations without calling SUBMIT, so it has no "
        "answer (a guess made from its last output is not one). Ask again with a narrower "
        "task, or let it run longer (max_iters in the RLM settings)"
    )


class RecordedRLM(dspy.RLM):  # type: ignore[misc]  # dspy ships no types
    def __init__(self, signature: str, *, hooks: RunHooks, **options: Any) -> None:
        super().__init__(signature, **options)
        self._hooks = hooks
        self.generate_action: Any = Predictor(self.generate_action, after=hooks.planned_from)
        self.max_llm_calls = UNCOUNTED  # the prompt keeps the tree's cap: it was built above

    def _execute_iteration(
        self, repl: Any, variables: Any, history: Any, iteration: int, *rest: Any
    ) -> Any:
        self._hooks.boundary(iteration)
        return super()._execute_iteration(repl, variables, history, iteration, *rest)

    def _extract_fallback(self, *args: Any) -> Any:
        """dspy, at the last iteration without `SUBMIT`, asks an extract step to make up the
        outputs ("Extract forced final output"): a guess, not the run's result. The run fails
        `no_submit` instead, naming what to do, and that model call is never made."""
        self._hooks.boundary(None)
        raise RunFailure(no_submit_message(self.max_iters), code=NO_SUBMIT)


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
    begun = lifecycle.begin(journal)
    if isinstance(begun, lifecycle.FromRecord):  # its holder died after the end: it stands
        return RlmResult.ended(
            begun.outcome, head_hash=loaded.head.hash, iterations=len(journal.plans),
            llm_calls=len(journal.calls),
        )  # fmt: skip
    recorder = RunRecorder(ctx, journal, loaded.head)
    resume = Resume(ctx, journal)
    hooks = RunHooks(ctx, recorder, resume)
    children = ChildRuns(task, ctx, recorder, resume)
    try:
        if isinstance(begun, lifecycle.TakeOver):
            lost = _sandbox_lost(journal, ctx)
            if lost:
                return await _end(recorder, hooks, lifecycle.lost(lost))
            if journal.cell_in_flight:
                await _move_to_fork(ctx)
            await recorder.arecord(
                lifecycle.taken_over(
                    journal, attempt=ctx.attempt, replica=ctx.mesh.actor.replica,
                    sandbox=ctx.sandbox,
                )
            )  # fmt: skip
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
        cancelled = lifecycle.Cancelled(reason=ctx.cancel.reason, partial=hooks.last_reasoning)
        return await _end(recorder, hooks, cancelled)
    except Exception as exc:
        log.exception("rlm run failed", extra={"run": ctx.run})
        # a failure it states (a model call's kind, the repository), or what broke, in full
        return await _end(recorder, hooks, lifecycle.failure(exc, detailed=True))
    outputs = {name: preview(getattr(prediction, name)) for name in _output_names(task)}
    answer = str(getattr(prediction, task.answer_field, "") or "")
    completed = lifecycle.Completed(
        answer=answer, outputs=outputs, iterations=hooks.iterations, llm_calls=recorder.llm_calls
    )
    return await _end(recorder, hooks, completed)


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


def _started(task: RlmTask, ctx: RunContext) -> RunStarted:
    return RunStarted(
        kind="rlm", tree=ctx.tree, depth=ctx.depth, task=str(task.inputs.get("task", ""))[:2000],
        signature=task.signature, inputs=preview(task.inputs), max_iters=task.max_iters,
        max_llm_calls=task.max_llm_calls, sandbox=ctx.sandbox, parent_call=ctx.parent_call,
    )  # fmt: skip


async def _end(recorder: RunRecorder, hooks: RunHooks, outcome: lifecycle.Outcome) -> RlmResult:
    """Append the run's one terminal event for `outcome`; the result the caller reads."""
    try:
        head = await recorder.arecord(lifecycle.ended(outcome))
    except RunFenced as exc:
        return RlmResult(status="failed", error=str(exc), retryable=True, fenced=True)
    return RlmResult.ended(
        outcome, head_hash=head.hash, iterations=hooks.iterations, llm_calls=recorder.llm_calls
    )


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
            on_delta=recorder.live if streams else None, announce=recorder.live,
            checkpoint=lambda: hooks.boundary(None), grant_id=recorder.next_grant_id,
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


__all__ = ["FACADE_RLM_REFUSED", "SANDBOX_LOST", "RecordedRLM", "run_rlm"]
