"""One chat turn in dspy's thread: the modules, the escalations, the fallbacks, the record.

How the run begins and ends (fresh, resumed from a parked question, taken over from a dead
holder's record, read from a record that ends; the one terminal event) is the run kernel's
lifecycle (`fleet_agent.run.lifecycle`), the RLM engine's too; a failure's code, flag and
message are the failure family's (`fleet_agent.run.failures`).
"""

import asyncio
import logging
import re
import threading
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import dspy

from fleet_agent.chat import escalation
from fleet_agent.chat.loading import Started, Taken
from fleet_agent.chat.react import ChatReAct, EscalateToRlm, RlmRouteFailed
from fleet_agent.chat.resume import Crashed
from fleet_agent.chat.signatures import RLM_TURN, ChatAgent, ChatTurn, ComputeTurn
from fleet_agent.chat.tools import (
    ParkTurn,
    ToolKit,
    TurnState,
    child_run,
    listing,
    recorded,
    toolset,
)
from fleet_agent.chat.tools.sandbox import Sandbox
from fleet_agent.chat.turn_context import code_variables
from fleet_agent.engine.journal_lm import journal_lm
from fleet_agent.engine.model import (
    RlmResult,
    RlmTask,
    RunCancelledError,
    RunContext,
    RunFenced,
)
from fleet_agent.engine.recorder import RunRecorder
from fleet_agent.engine.resume import Resume as EngineResume
from fleet_agent.lm import CallScope, budgeted_lm
from fleet_agent.run import lifecycle
from fleet_agent.run.failures import (
    NOT_COMPUTED,
    RunBroke,
    RunFailure,
    falls_back,
    stated,
    why,
)
from fleet_agent.run.seams import Predictor, blocking
from fleet_agent.runners import Answered, Failed, Parked, Stopped
from fleet_events.run import Escalated, FellBack, IterationPlanned, RunStarted, ToolReturned
from fleet_events.session_fold import SessionState, history

if TYPE_CHECKING:
    from fleet_agent.chat.runner import ChatRunner

log = logging.getLogger("fleet.agent.chat")
T = TypeVar("T")


class TurnRun:
    """One turn in dspy's thread: the modules, the escalations, the fallbacks, the record."""

    def __init__(
        self, runner: "ChatRunner", ctx: RunContext, state: SessionState, mode: str, message: str,
        loop: asyncio.AbstractEventLoop, resume: Started | None = None,
        taken: Taken | None = None, *, context_in_sandbox: bool = False, asked: str | None = None,
        attached: str = "",
    ) -> None:  # fmt: skip
        self.runner = runner
        self.resume = resume
        self.taken = taken
        self.ctx = ctx
        self.mode = mode
        self.message = message
        self.loop = loop
        self.recorder = (
            RunRecorder(ctx) if taken is None else RunRecorder(ctx, taken.journal, taken.head)
        )
        self.iterations = 0
        self.last_thought = ""
        self._sandbox = ""
        self.may_escalate = True
        """False once a module fell back: the turn does not climb again."""
        self.context_in_sandbox = context_in_sandbox
        self.asked = message if asked is None else asked
        """The user's message alone (the computable rule reads it, not the attached text)."""
        self.attached = attached
        """The attached context's text (documents put in whole, files and repository named):
        the code route's cell gets it as the variable `context`."""
        """The turn's context is reachable only with tools: ChainOfThought is no fallback."""
        self.fallback = ""
        """`fallback_note` of the last fallback this attempt took (empty: none)."""
        image = state.image
        self.state = TurnState(
            memory=image.core_memory,
            documents={d.alias: d for d in image.documents},
            active=image.active_document,
            memory_files={f.path: f for f in image.memory_files},
            history=history(state),
        )
        options = runner._options
        self.kit = ToolKit(
            ctx=ctx, recorder=self.recorder, state=self.state, engine=self._engine,
            sandbox=self.sandbox, urls=runner._urls, rlm_task=runner._rlm_task,
            clarify_timeout_s=options.clarify_timeout_s, mode=mode, park=options.park,
        )  # fmt: skip
        self._grants = 0
        self._grant_lock = threading.Lock()
        if resume is not None:
            self.recorder.head = resume.head
            self.recorder.llm_calls = resume.point.llm_calls
            self._grants = resume.point.grants
            self.kit.calls = resume.point.tool_calls
            self.iterations = resume.point.iterations
        point = taken.point if taken is not None else None
        if taken is not None and point is not None:
            self.recorder.llm_calls = point.llm_calls
            self._grants = taken.journal.max_call_index
            # the call in flight runs again under its recorded id (`ToolKit.next_call_id`)
            self.kit.calls = point.tool_calls - (1 if point.in_flight is not None else 0)
            self.iterations = point.iterations
            self.may_escalate = not point.fell_back
            self.fallback = point.fallback_note
        if taken is not None:
            self.kit.returned = taken.returned  # a recorded result is not made again
            self.kit.stored = taken.facts  # nor a session fact stored

    # -- seams to the agent's loop ---------------------------------------------------------

    def _on_loop(self, work: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return blocking(self.loop, work, timeout)

    def sandbox(self) -> str:
        """The session's sandbox, found or made on first use only (a CoT turn needs none)."""
        if not self._sandbox:
            ctx = self.ctx
            self._sandbox = self._on_loop(
                self.runner._sandbox_of(ctx.mesh, ctx.tenant, ctx.session, ctx.turn), 120
            )
        return self._sandbox

    def _engine(self, task: RlmTask, ctx: RunContext) -> RlmResult:
        return self._on_loop(self.runner._engine(task, ctx))

    # -- steps -----------------------------------------------------------------------------

    def boundary(self) -> None:
        if self.ctx.cancel.is_set:
            raise RunCancelledError(self.ctx.cancel.reason)

    def planned(self, thought: str, tool: str) -> None:
        self.last_thought = thought
        self.recorder.record(
            IterationPlanned(
                index=self.iterations, reasoning=thought, tool=tool,
                llm_call=self.recorder.last_step_call,
            )
        )  # fmt: skip
        self.iterations += 1

    def _before_step(self, inputs: dict[str, Any]) -> None:
        """Before a ReAct step: a step boundary, and the context's growth checked."""
        self.boundary()
        self.check_growth(str(inputs.get("trajectory", "")))

    def _after_step(self, prediction: Any) -> None:
        self.planned(str(prediction.next_thought or ""), str(prediction.next_tool_name or ""))

    def check_growth(self, trajectory: str) -> None:
        """Before a ReAct step: raise `EscalateToRlm` when the context has outgrown the
        threshold (`escalation.during_react`)."""
        if not trajectory or not self.may_escalate:
            return
        chars = escalation.context_chars(self.message, self.state.history, self.memory_text)
        move = escalation.during_react(
            self.mode, chars + len(trajectory), self.runner._options.context_threshold
        )
        if move is not None:
            raise EscalateToRlm(move, trajectory)

    def next_grant_id(self) -> str:
        """The run's next grant id (`<run>-g<n>`, the form the recorder reads positions
        from), continuing a resumed run's numbering: a reused id would be answered with the
        old grant, and the call would go unbudgeted."""
        with self._grant_lock:
            self._grants += 1
            return f"{self.ctx.run}-g{self._grants}"

    def lm(self) -> Any:
        ctx = self.ctx
        scope = CallScope(
            tenant=ctx.tenant, tree=ctx.tree, run=ctx.run, role="planner", kind="step"
        )
        return budgeted_lm(
            ctx.mesh.bus, ctx.mesh.lm, scope,
            on_call=self.recorder.on_llm_call, on_delta=self.recorder.live,
            announce=self.recorder.live, checkpoint=self.boundary, grant_id=self.next_grant_id,
            run_deadline=ctx.deadline,
        )  # fmt: skip

    @property
    def memory_text(self) -> str:
        m = self.state.memory
        return f"persona: {m.persona}\nhuman: {m.human}\nscratchpad: {m.scratchpad}"

    def cot(self) -> tuple[str, Escalated | None]:
        self.boundary()
        prediction = dspy.ChainOfThought(ChatTurn)(
            question=self.message,
            history=dspy.History(messages=self.state.history),
            core_memory=self.memory_text,
        )
        reasoning = str(getattr(prediction, "reasoning", "") or "")
        self.planned(reasoning, "")
        needs = bool(getattr(prediction, "needs_tools", False))
        return str(prediction.answer or ""), escalation.after_cot(needs, reasoning)

    def react(self, start: dict[str, Any] | None = None) -> str:
        agent = ChatReAct(
            ChatAgent, tools=toolset(self.kit), max_iters=self.runner._options.react_max_iters,
            start=start,
        )  # fmt: skip
        agent.react = Predictor(agent.react, before=self._before_step, after=self._after_step)
        agent.extract = Predictor(agent.extract, before=lambda _: self.boundary())
        prediction = agent(
            question=self.message,
            history=dspy.History(messages=self.state.history),
            core_memory=self.memory_text,
            documents=listing(self.state),
        )
        return str(prediction.answer or "")

    def code(self) -> str:
        """A computable question: the model writes one cell, the sandbox runs it, and its
        output is the answer, citing the cell. A second try is shown the first's error; two
        failures end the turn `not_computed`, with the last error: no module's guess is given
        in place of a computation (the embedded model's 17 * 23 = 451)."""
        self.boundary()
        inputs = code_variables(self.attached)
        sandbox = Sandbox(self.kit)

        def execute_code(code: str) -> str:
            return sandbox.run_cell(code, inputs.variables)

        cell = recorded(self.kit, "execute_code", execute_code)
        error = ""
        for attempt in range(CODE_ATTEMPTS):
            self.boundary()
            # a retry samples (the same seed: the same retry every time): at temperature 0 a
            # small model shown its error writes the same failing line again
            config = {"temperature": RETRY_TEMPERATURE} if attempt else {}
            prediction = dspy.Predict(ComputeTurn)(
                question=self.asked,
                variables=inputs.described,
                previous_error=error,
                config=config,
            )
            written = _bare_code(str(prediction.code or ""))
            if inputs.prelude:  # the named files, read into the variables the prompt named
                written = f"{inputs.prelude}\n{written}"
            self.planned("computing the answer with one sandbox cell", "execute_code")
            output = str(cell(code=written)).strip()
            if output and not output.startswith("error:"):
                return f"{output}\n\n(computed in the sandbox by:\n```python\n{written}\n```)"
            error = output.removeprefix("error:").strip() or "the code printed nothing"
        raise RunFailure(
            f"this question is one code computes, and the {CODE_ATTEMPTS} cells the model wrote "
            f"did not compute an answer (the last: {error[:300]}); no guess is given instead. "
            "Ask again in other words, or use a stronger model (docs/local-llm.md)",
            code=NOT_COMPUTED,
        )

    def _formatted(self, trajectory: dict[str, Any]) -> str:
        """ReAct's trajectory as its step saw it when the turn went up to the RLM (the route's
        task is then the one recorded, and its resumed run matches its recorded calls)."""
        agent = ChatReAct(ChatAgent, tools=toolset(self.kit), max_iters=1)
        return str(agent._format_trajectory(trajectory))

    def rlm(self, trajectory: str = "") -> str:
        self.boundary()
        context = {"history": self.state.history, "core_memory": self.memory_text}
        if trajectory:  # escalated from ReAct: what its tools found so far
            context["trajectory"] = trajectory
        task = RlmTask(
            inputs={"task": self.message, "context": context}, signature=RLM_TURN,
            max_iters=self.runner._rlm_task.max_iters,
            max_llm_calls=self.runner._rlm_task.max_llm_calls,
            max_depth=self.runner._rlm_task.max_depth,
            cell_wall_s=self.runner._rlm_task.cell_wall_s,
        )  # fmt: skip
        result = child_run(self.kit, task, f"{self.ctx.run}-route", 0, self.message)
        if result.status == "cancelled":
            raise RunCancelledError(self.ctx.cancel.reason)
        if result.status != "completed":
            raise RlmRouteFailed(result.error or result.status, result.code, result.retryable)
        return result.answer

    # -- the turn --------------------------------------------------------------------------

    def run(self) -> Answered | Stopped | Parked | Failed:
        ctx = self.ctx
        options = self.runner._options
        adapter = dspy.ChatAdapter(use_json_adapter_fallback=False)
        try:
            if self.resume is not None:
                return self._resumed(adapter)
            if self.taken is not None:
                return self._taken_over(adapter, self.taken)
            self.recorder.record(RunStarted(
                kind="chat", tree=ctx.tree, task=self.message[:2000], mode=self.mode,
                signature="ChatAgent", inputs={"question": self.message[:2000]},
                max_iters=options.react_max_iters,
                max_llm_calls=self.runner._rlm_task.max_llm_calls,
            ))  # fmt: skip
            with dspy.context(lm=self.lm(), adapter=adapter):
                answer, module = self._modules()
            self.boundary()  # a cancel that came during the last model call still cancels
            return self._completed(answer, module)
        except ParkTurn as parked:
            return Parked(parked.request_id)
        except RunFenced:
            log.warning("chat run fenced: recording nothing more", extra={"run": ctx.run})
            raise
        except RunCancelledError:
            return self._ended(lifecycle.Cancelled(ctx.cancel.reason, self.last_thought))
        except Exception as exc:
            # a failure it states (no model to ask, a model call's kind, the budget, the
            # repository: what to do), or the type that broke (the worker says where to look)
            return self._ended(lifecycle.failure(exc))

    def _ended(self, outcome: lifecycle.Outcome) -> Answered | Stopped | Failed:
        """The run's one terminal event for `outcome`, and how the turn ends."""
        head = self.recorder.record(lifecycle.ended(outcome))
        return lifecycle.turn_end(outcome, head.hash)

    def _resumed(self, adapter: Any) -> Answered:
        """Carry on where the run parked: the question's answer is the parked call's result,
        and ReAct goes on from the trajectory the record holds."""
        assert self.resume is not None
        pending = self.resume.point.pending
        self.recorder.record(
            ToolReturned(
                call_id=pending.call_id, tool=pending.tool, result=self.resume.result,
                error=self.resume.error,
            )
        )  # fmt: skip
        module = "react"
        with dspy.context(lm=self.lm(), adapter=adapter):
            try:
                answer = self.react(start=self.resume.point.trajectory)
            except EscalateToRlm as up:
                self.recorder.record(up.move)
                answer, module = self.rlm(up.trajectory), "rlm"
        return self._completed(answer, module)

    def _completed(self, answer: str, module: str) -> Answered:
        """`run.completed` naming the module that answered; the turn ties in its chain head."""
        completed = lifecycle.Completed(
            answer=answer, outputs={"module": module}, iterations=self.iterations,
            llm_calls=self.recorder.llm_calls, answered_by=module, fallback=self.fallback,
        )  # fmt: skip
        ended = self._ended(completed)
        assert isinstance(ended, Answered)
        return ended

    def _taken_over(self, adapter: Any, taken: Taken) -> Answered | Stopped | Failed:
        """Carry on a run whose holder died, from its record: `run.resumed` appended against
        the head read (the old holder's next append is refused), then the module the record
        was in goes on from where it stands (`chat.resume.crashed`)."""
        begun = lifecycle.begin(taken.journal)
        if isinstance(begun, lifecycle.FromRecord):  # its end stands, nothing runs again
            return lifecycle.turn_end(begun.outcome, taken.head.hash)
        point = taken.point
        if point is None:  # a record crashed() cannot read: not continued blind
            raise RunBroke("the chat run's record cannot be continued")
        ctx = self.ctx
        self.recorder.record(
            lifecycle.taken_over(
                taken.journal, attempt=ctx.attempt, replica=ctx.mesh.actor.replica,
                in_flight=point.what_repeats, reused_calls=point.llm_calls,
            )
        )  # fmt: skip
        lm = self.lm()
        if taken.journal.calls:  # a recorded answer is not asked (and paid) again
            self.recorder.counts_reused = False  # `point.llm_calls` counted them
            lm = journal_lm(lm, EngineResume(ctx, taken.journal), self.recorder)
        with dspy.context(lm=lm, adapter=adapter):
            answer, module = self._modules(point)
        self.boundary()
        return self._completed(answer, module)

    def _modules(self, point: Crashed | None = None) -> tuple[str, str]:
        """The escalation loop: (answer, the module that gave it); from `point` for a run
        taken over from its record (no opening move: the record holds it)."""
        chars = escalation.context_chars(self.message, self.state.history, self.memory_text)
        move = escalation.opening(
            self.mode, chars, self.message, self.runner._options.context_threshold
        )
        if (
            point is None
            and self.mode != "rlm_only"
            and (move is None or move.rule != "context_over_threshold")
        ):
            decided = escalation.computable(self.asked, bool(self.attached))
            self.recorder.record(decided)
            if decided.computable:
                move = escalation.to_code(decided)
        module = "cot"
        fell_back = False
        trajectory = ""
        start: dict[str, Any] | None = None
        if point is not None and point.moved:
            move, module, fell_back = None, point.module, point.fell_back
            start = point.trajectory or None
            if module == "rlm" and point.escalated_from_react and start:
                trajectory = self._formatted(start)
            if module == "code":
                # the code route goes again from its first attempt, under the ids it had:
                # its recorded calls and cells are answered from the record, not made again
                self.kit.calls = self.iterations = 0
        while True:
            if move is not None:
                self.recorder.record(move)
                module = move.to_module
                move = None
            try:
                if module == "cot":
                    answer, move = self.cot()
                    if move is None or fell_back:
                        return answer, "cot"
                    continue
                if module == "code":
                    return self.code(), "code"
                if module == "react":
                    begun, start = start, None
                    return self.react(begun), "react"
                return self.rlm(trajectory), "rlm"
            except EscalateToRlm as up:
                move, trajectory = up.move, up.trajectory
                continue
            except (RunCancelledError, RunFenced):
                raise
            except Exception as exc:
                lower = escalation.fallback_from(
                    module, self.mode, context_in_sandbox=self.context_in_sandbox
                )
                if lower is None or not falls_back(exc):
                    raise
                log.warning(
                    "chat module failed: falling back",
                    extra={"run": self.ctx.run, "from_module": module},
                    exc_info=True,
                )
                self.recorder.record(
                    FellBack(
                        from_module=module,
                        to_module=lower,
                        reason=f"{module}_failed",
                        error=why(exc),
                        note=escalation.fallback_note(module, lower, _reason(exc)),
                    )
                )
                self.fallback = escalation.fallback_note(module, lower, _reason(exc))
                module = lower
                fell_back = True
                self.may_escalate = False


CODE_ATTEMPTS = 2
RETRY_TEMPERATURE = 0.7
"""The code route's second attempt samples at this temperature (the profile's seed kept)."""
_FENCE = re.compile(r"^```(?:python|py)?\s*\n(.*?)\n?```\s*$", re.DOTALL)


def _bare_code(text: str) -> str:
    """The code out of a reply that wrapped it in a markdown fence anyway."""
    text = text.strip()
    fenced = _FENCE.match(text)
    return fenced.group(1).strip() if fenced else text


def _reason(exc: BaseException) -> str:
    """Why a module failed, in the words the fallback line shows: the failure it states with
    its code, or only the type that broke (its text may hold anything; the trace has it)."""
    failure = stated(exc)
    if failure is not None:
        return f"{failure.error} ({failure.code})"
    return f"it broke ({type(exc).__name__}; the turn's trace has the details)"


__all__ = ["TurnRun"]
