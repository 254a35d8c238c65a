"""The chat agent as the turn runner (`FLEET_AGENT_RUNNER=chat`): one root run of kind `chat`
per turn, escalating CoT -> ReAct -> RLM by the rule in `escalation`, every step recorded on
`fleet.session.<t>.<s>.run.<root run>`.

Per turn: rebuild the session by its fold (and read the turn's execution mode from its
request), open the turn's budget tree, run the modules in dspy's thread with the budget-aware
LM (every call granted as a `step` of this run, then recorded as `run.llm_called`), record one
terminal event, close the tree. The RLM route and the recursion tools run child runs of this
run through the engine (`fleet_agent.engine.run_rlm`), in the same tree.

`restartable` is True, as for the engine's runner (issue 16): the run and tree ids are derived
from the turn, so a later attempt lands on the run subject the dead holder wrote and carries
on from its record (`chat.resume.crashed`): ReAct's trajectory rebuilt up to the last tool call
with a result, recorded model calls not asked again, the one tool call in flight run again
under its recorded id, an escalation to the RLM resumed through the engine's own resume
(docs/turns.md, "Which step repeats").

A model call's failure ends the turn as `Failed` with the call's kind (`llm_failures`): the
code, the flag and a message naming the profile and model; the RLM route's run carries the
kind in its result. A kind no other module can get past (a refused key, a rate limit, an
unreachable server) ends the turn at once instead of falling back to ask the same model again.
"""

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import dspy
from dspy.utils.exceptions import LMError

from fleet_agent.chat import escalation
from fleet_agent.chat.resume import Crashed, Resume, answer_text, crashed, rebuild
from fleet_agent.chat.session_log import LogScope, append
from fleet_agent.chat.settings import ChatSettings
from fleet_agent.chat.signatures import RLM_TURN, ChatAgent, ChatTurn
from fleet_agent.chat.tools import ParkTurn, ToolKit, TurnState, child_run, listing, toolset
from fleet_agent.chat.turn_context import read_context
from fleet_agent.chat.urls import UrlLoader
from fleet_agent.engine.mesh import MeshPool
from fleet_agent.engine.model import (
    EngineMesh,
    RlmResult,
    RlmTask,
    RunCancelledError,
    RunContext,
    RunFenced,
    derived_id,
    root_run_id,
    tree_id,
)
from fleet_agent.engine.recorder import RunRecorder
from fleet_agent.engine.rlm import run_rlm
from fleet_agent.engine.runner import child_run_consumer, session_sandbox
from fleet_agent.engine.settings import EngineSettings
from fleet_agent.lenient import LenientCodec
from fleet_agent.llm_failures import LLM_FAILURES, NO_FALLBACK
from fleet_agent.lm import CallScope, LmNotConfigured, budgeted_lm, failure_of
from fleet_agent.runners import (
    Answered,
    CancelToken,
    Failed,
    Parked,
    Stopped,
    TurnInput,
    stated_failure,
)
from fleet_events import Event, bus, streams
from fleet_events import journal as jr
from fleet_events.budget import CloseTree, OpenTree
from fleet_events.run import (
    Escalated,
    FellBack,
    IterationPlanned,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunResumed,
    RunStarted,
    ToolReturned,
)
from fleet_events.session import (
    InputExpired,
    InputProvided,
    InputRequested,
    TurnRequested,
    log_subject,
    run_subject,
)
from fleet_events.session_fold import FOLD, SessionState, history, skipped_line
from fleet_mesh import rpc
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.secrets import SecretError, private_key_from_env
from fleet_mesh.service import ServiceContext
from fleet_mesh.store import EMPTY, EventStore, Head

log = logging.getLogger("fleet.agent.chat")
T = TypeVar("T")

AsyncEngine = Callable[[RlmTask, RunContext], Coroutine[Any, Any, RlmResult]]
SandboxOf = Callable[[EngineMesh, str, str, str], Coroutine[Any, Any, str]]


@dataclass(frozen=True)
class ChatOptions:
    context_threshold: int = escalation.CONTEXT_THRESHOLD
    react_max_iters: int = 15
    clarify_timeout_s: float = 600.0
    park: bool = False
    """Give the worker back while the user thinks (`TurnParked`); the service parks, tests of
    the runner alone (no worker to resume it) wait in the turn."""

    @classmethod
    def of(cls, settings: ChatSettings) -> "ChatOptions":
        return cls(
            context_threshold=settings.context_threshold,
            react_max_iters=settings.react_max_iters,
            clarify_timeout_s=settings.clarify_timeout_s,
            park=settings.park,
        )


class ChatFailed(RuntimeError):
    """Every module the turn could use failed; the run's `run.failed` says which and why."""


class _Stop(Exception):
    """The turn's run was fenced or cancelled: unwind dspy, record what applies."""


NOT_CONFIGURED = "llm_not_configured"


def not_configured(exc: BaseException) -> LmNotConfigured | None:
    """The budgeted LM's "no usable profile or key" error, if that is what ended the turn
    (dspy may raise it as is or as the cause of its own)."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, LmNotConfigured):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def not_configured_message(exc: LmNotConfigured) -> str:
    """What `TurnFailed` says when the chat agent has no model to ask: what is missing and
    the ways to configure one (the message is the LM's own, which names no key)."""
    return (
        f"the chat agent has no language model to answer with ({exc}). Configure one: point "
        "fleet up at an OpenAI-compatible server with FLEET_LLM_MODEL, FLEET_LLM_API_BASE and "
        "FLEET_LLM_API_KEY; or start fleet up without --llm none to serve the embedded local "
        "model; or store an LLM profile and bind the planner role to it (docs/llm.md). "
        "FLEET_AGENT_RUNNER=echo runs turns with no model at all"
    )


def llm_failed(exc: BaseException) -> Failed | None:
    """How the turn ends when a model call's failure ended the run (None: it did not)."""
    failure = failure_of(exc)
    if failure is not None:
        return Failed(failure.message, code=failure.code, retryable=failure.retryable)
    if isinstance(exc, RlmRouteFailed) and exc.code in LLM_FAILURES:
        return Failed(str(exc), code=exc.code, retryable=exc.retryable)
    return None


def _falls_back(exc: BaseException) -> bool:
    """May a cheaper module get past this? Not a failure that asks the same server again, nor
    a stated one (the turn's repository could not be cloned: an answer without it would not be
    the one asked for)."""
    if stated_failure(exc) is not None:
        return False
    ended = llm_failed(exc)
    return ended is None or ended.code not in NO_FALLBACK


def _why(exc: BaseException) -> str:
    """What a fallback or failure records: the type, and the message only where it is ours
    and scrubbed (the budgeted LM's errors); anything else may hold anything."""
    if isinstance(exc, LMError):
        return f"{type(exc).__name__}: {exc}"[:1000]
    return type(exc).__name__


async def load_session(mesh: EngineMesh, turn: TurnInput) -> tuple[SessionState, str]:
    """The session's fold and the turn's mode, in one pass over its log (on the bus loop)."""
    state, request, _ = await load_turn(mesh, turn)
    return state, request.mode if request is not None else "auto"


async def load_turn(
    mesh: EngineMesh, turn: TurnInput, max_chars: int | None = None
) -> tuple[SessionState, TurnRequested | None, str]:
    """The session's fold, the turn's request and the context it names (`turn_context`), in
    one pass over its log (on the bus loop).

    Only the `.log` subject is read: the fold leaves run steps alone (docs/agent.md), so the
    state is the one the whole session filter gives, without reading every model call of
    every earlier turn (the test of restore folds the whole filter and compares)."""
    js = mesh.bus.nc.jetstream()
    blobs = await JetStreamBlobs.open(js)
    store = EventStore(js, streams.SESSIONS, LenientCodec(blobs))
    state = FOLD.initial()
    request: TurnRequested | None = None
    async for stored in store.replay(log_subject(turn.tenant, turn.session)):
        state = FOLD.evolve(state, stored)
        data = stored.envelope.data
        if isinstance(data, TurnRequested) and stored.envelope.turn == turn.turn:
            request = request or data  # the same turn asked twice: the first request stands
    line = skipped_line(state)
    if line is not None:
        log.warning(line, extra={"session": turn.session})
    documents = {d.alias: d for d in state.image.documents}
    context = await read_context(blobs, turn.tenant, request, documents, max_chars=max_chars)
    return state, request, context


async def load_resume(mesh: EngineMesh, turn: TurnInput, timeout_s: float) -> "Started | None":
    """Where a parked turn's run stands (on the bus loop): its record, its head, and the
    answer to the question it parked on, read from the log."""
    run = root_run_id(turn.tenant, turn.session, turn.turn)
    subject = run_subject(turn.tenant, turn.session, run)
    events = [stored.envelope.data async for stored in mesh.store.replay(subject)]
    head = await mesh.store.head(subject)
    js = mesh.bus.nc.jetstream()
    lenient = EventStore(js, streams.SESSIONS, LenientCodec(await JetStreamBlobs.open(js)))
    asked: InputRequested | None = None
    answers: dict[str, InputProvided | InputExpired] = {}
    async for stored in lenient.replay(log_subject(turn.tenant, turn.session)):
        data = stored.envelope.data
        if isinstance(data, InputRequested) and stored.envelope.run == run:
            asked = data
        elif isinstance(data, InputProvided | InputExpired):
            answers[data.request_id] = data
    if asked is None:
        return None
    result, error = answer_text(answers.get(asked.request_id), timeout_s)
    point = rebuild(events, result)
    return None if point is None else Started(point, head, result, error)


@dataclass(frozen=True)
class Taken:
    """A run whose holder died (a redelivered attempt, not a parked one): its record folded,
    the head the next append is made against, and where it stands (None: it had ended)."""

    events: list[Event]
    journal: jr.Journal
    head: Head
    point: Crashed | None


async def load_crashed(mesh: EngineMesh, turn: TurnInput) -> Taken | None:
    """The record of a turn's run left by a holder that died (on the bus loop); None when
    the dead holder recorded no `run.started` (the turn then runs from the start)."""
    run = root_run_id(turn.tenant, turn.session, turn.turn)
    journal = jr.Journal()
    events: list[Event] = []
    head = EMPTY
    async for stored in mesh.store.replay(run_subject(turn.tenant, turn.session, run)):
        events.append(stored.envelope.data)
        jr.evolve(journal, stored.envelope.data)
        head = Head(stored.seq, stored.hash)
    if not events or not isinstance(events[0], RunStarted):
        return None
    return Taken(events, journal, head, crashed(events))


@dataclass(frozen=True)
class Started:
    """A resumed run: where its record ends and what the parked call returns."""

    point: Resume
    head: Head
    result: str
    error: str


class ChatRunner:
    restartable = True

    def __init__(
        self,
        pool: MeshPool,
        rlm_task: RlmTask,
        options: ChatOptions | None = None,
        *,
        engine: AsyncEngine = run_rlm,
        sandbox_of: SandboxOf = session_sandbox,
        urls: UrlLoader | None = None,
        on_turn_end: Callable[[TurnState], object] | None = None,
    ) -> None:
        self._pool = pool
        self._rlm_task = rlm_task
        self._options = options or ChatOptions()
        self._engine = engine
        self._sandbox_of = sandbox_of
        self._urls = urls or UrlLoader()
        self._on_turn_end = on_turn_end
        """Handed the state the turn's tools held at its end (tests compare it with the fold)."""
        self._timers: set[asyncio.Future[None]] = set()

    async def run(
        self, turn: TurnInput, token: CancelToken
    ) -> Answered | Stopped | Parked | Failed:
        mesh = await self._pool.get(turn.tenant)
        threshold = self._options.context_threshold
        state, request, context = await _on_bus(mesh, load_turn(mesh, turn, threshold))
        mode = request.mode if request is not None else "auto"
        resume = None
        taken = None
        if turn.attempt > 1:  # a parked turn answered, or a dead holder's turn redelivered
            timeout = self._options.clarify_timeout_s
            resume = await _on_bus(mesh, load_resume(mesh, turn, timeout))
            if resume is None:
                taken = await _on_bus(mesh, load_crashed(mesh, turn))
        escalation.check_mode(mode)
        tree = tree_id(turn.tenant, turn.session, turn.turn)
        run = root_run_id(turn.tenant, turn.session, turn.turn)
        task = self._rlm_task
        steps = max(self._options.react_max_iters + 3, task.max_iters + 1)
        await _on_bus(mesh, rpc.call_verb(mesh.bus.nc, bus.OPEN_TREE, OpenTree(
            request_id=derived_id("open", tree), tenant=turn.tenant, tree=tree,
            max_llm_calls=task.max_llm_calls, max_depth=task.max_depth,
            max_steps_per_run=steps, session=turn.session, turn=turn.turn, root_run=run,
        ), timeout=15))  # fmt: skip
        ctx = RunContext(
            tenant=turn.tenant, session=turn.session, turn=turn.turn, run=run, tree=tree,
            sandbox="", mesh=mesh, attempt=turn.attempt,
        )  # fmt: skip
        loop = asyncio.get_running_loop()
        chat = TurnRun(self, ctx, state, mode, turn.message + context, loop, resume, taken)
        mirror = asyncio.ensure_future(_mirror(token, ctx))
        outcome: Answered | Stopped | Parked | Failed | None = None
        try:
            outcome = await asyncio.to_thread(chat.run)
            return outcome
        finally:
            mirror.cancel()
            if self._on_turn_end is not None:
                self._on_turn_end(chat.state)
            if isinstance(outcome, Parked):
                # the tree stays open for the resumed attempt; the question expires on time
                # even though no worker holds the turn (this replica's timer)
                expiry = asyncio.ensure_future(self._expire(mesh, turn, outcome.request_id))
                self._timers.add(expiry)
                expiry.add_done_callback(self._timers.discard)
            elif not chat.recorder.fenced:  # a fenced attempt's tree is the new holder's
                close = CloseTree(
                    request_id=derived_id("close", tree), tree=tree, reason="turn ended"
                )
                await _on_bus(mesh, rpc.call_verb(mesh.bus.nc, bus.CLOSE_TREE, close, timeout=15))

    async def _expire(self, mesh: EngineMesh, turn: TurnInput, request_id: str) -> None:
        timeout = self._options.clarify_timeout_s
        await asyncio.sleep(timeout)
        state, _ = await _on_bus(mesh, load_session(mesh, turn))
        pending = state.pending_input
        if pending is None or pending.request_id != request_id:
            return  # answered (or ended) meanwhile
        scope = LogScope(turn.tenant, turn.session, turn.turn, pending.run or "")
        expired = InputExpired(request_id=request_id, reason=f"no answer in {timeout:g}s")
        await _on_bus(mesh, append(mesh, scope, expired))


async def chat_runner(ctx: ServiceContext) -> ChatRunner:
    """The runner `FLEET_AGENT_RUNNER=chat` selects, on connections of its own (as the
    engine's: dspy calls back from its threads); it needs the services' private key to open
    model keys."""
    key = private_key_from_env()
    if key is None:
        raise SecretError(
            "FLEET_AGENT_RUNNER=chat needs the services' private key: "
            "set FLEET_SECRETS_KEY to its file"
        )
    url = ctx.nc.connected_url.geturl() if ctx.nc.connected_url else ""
    pool = MeshPool(url, ctx.actor, key)
    settings = EngineSettings()
    # the RLM's `sub_rlm` publishes child runs: without this consumer none is ever taken
    children = await child_run_consumer(ctx, pool, settings)

    async def stop() -> None:
        await children.stop()
        await asyncio.to_thread(pool.close)

    ctx.on_stop.append(stop)
    return ChatRunner(pool, settings.task(), ChatOptions.of(ChatSettings()))


async def _mirror(token: CancelToken, ctx: RunContext) -> None:
    await token.wait()
    ctx.cancel.set(token.reason or "cancelled")


async def _on_bus(mesh: EngineMesh, work: Coroutine[Any, Any, T]) -> T:
    return await asyncio.wrap_future(mesh.bus.submit(work))


class ChatReAct(dspy.ReAct):  # type: ignore[misc]  # dspy ships no types
    """dspy's ReAct that can start part way through, from a trajectory rebuilt from the run's
    record (`chat.resume`): a parked turn goes on without asking the model again for the
    steps it already took. Without `start` it is dspy's own loop."""

    def __init__(self, *args: Any, start: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._start = dict(start or {})

    def forward(self, **inputs: Any) -> Any:
        if not self._start:
            return super().forward(**inputs)
        trajectory = dict(self._start)
        taken = sum(1 for key in trajectory if key.startswith("thought_"))
        last = taken - 1
        done = taken > 0 and trajectory[f"tool_name_{last}"] == "finish"
        if taken > 0 and f"observation_{last}" not in trajectory:
            # the tool call a dead holder left in flight: run again (under its recorded id)
            name, args = trajectory[f"tool_name_{last}"], trajectory[f"tool_args_{last}"]
            try:
                trajectory[f"observation_{last}"] = self.tools[name](**args)
            except Exception as exc:
                trajectory[f"observation_{last}"] = f"Execution error in {name}: {exc}"
        for step in range(taken, self.max_iters if not done else taken):
            try:
                chosen = self._call_with_potential_trajectory_truncation(
                    self.react, trajectory, **inputs
                )
            except ValueError:  # no valid tool chosen (or no room left): end the loop
                break
            name, args = chosen.next_tool_name, chosen.next_tool_args
            trajectory[f"thought_{step}"] = chosen.next_thought
            trajectory[f"tool_name_{step}"] = name
            trajectory[f"tool_args_{step}"] = args
            try:
                trajectory[f"observation_{step}"] = self.tools[name](**args)
            except Exception as exc:
                trajectory[f"observation_{step}"] = f"Execution error in {name}: {exc}"
            if name == "finish":
                break
        extracted = self._call_with_potential_trajectory_truncation(
            self.extract, trajectory, **inputs
        )
        return dspy.Prediction(trajectory=trajectory, **extracted)


class _Step:
    """Stands in for one of ReAct's predictors: a step boundary (cancel) before the call,
    and the plan recorded after it."""

    def __init__(self, predict: Any, chat: "TurnRun", *, plans: bool) -> None:
        self.predict = predict
        self.chat = chat
        self.plans = plans

    @property
    def signature(self) -> Any:
        return self.predict.signature

    def __call__(self, **kwargs: Any) -> Any:
        self.chat.boundary()
        if self.plans:
            self.chat.check_growth(str(kwargs.get("trajectory", "")))
        prediction = self.predict(**kwargs)
        if self.plans:
            self.chat.planned(
                str(prediction.next_thought or ""), str(prediction.next_tool_name or "")
            )
        return prediction


class EscalateToRlm(Exception):
    """ReAct's context outgrew the threshold: unwind ReAct (dspy passes on anything but a
    ValueError or a context-window error) and go on in the RLM with its trajectory."""

    def __init__(self, move: Escalated, trajectory: str) -> None:
        super().__init__(move.detail)
        self.move = move
        self.trajectory = trajectory


class TurnRun:
    """One turn in dspy's thread: the modules, the escalations, the fallbacks, the record."""

    def __init__(
        self, runner: ChatRunner, ctx: RunContext, state: SessionState, mode: str, message: str,
        loop: asyncio.AbstractEventLoop, resume: Started | None = None,
        taken: Taken | None = None,
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

    # -- seams to the agent's loop ---------------------------------------------------------

    def _on_loop(self, work: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(timeout)

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
            grant_id=self.next_grant_id, run_deadline=ctx.deadline,
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
        agent.react = _Step(agent.react, self, plans=True)
        agent.extract = _Step(agent.extract, self, plans=False)
        prediction = agent(
            question=self.message,
            history=dspy.History(messages=self.state.history),
            core_memory=self.memory_text,
            documents=listing(self.state),
        )
        return str(prediction.answer or "")

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
            self.recorder.record(
                RunCancelled(reason=ctx.cancel.reason, partial_answer=self.last_thought)
            )
            return Stopped(self.last_thought)
        except Exception as exc:
            missing = not_configured(exc)
            if missing is not None:  # no model to ask: say what to configure, not a type name
                self.recorder.record(RunFailed(error=_why(missing), reason=NOT_CONFIGURED))
                return Failed(not_configured_message(missing), code=NOT_CONFIGURED)
            ended = llm_failed(exc) or stated_failure(exc)
            if ended is not None:  # a model call failed (its kind, what to do), or a stated one
                self.recorder.record(
                    RunFailed(error=ended.error, reason=ended.code, retryable=ended.retryable)
                )
                return ended
            self.recorder.record(RunFailed(error=_why(exc), reason=type(exc).__name__))
            raise ChatFailed(f"the chat run failed: {_why(exc)}") from exc

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
        head = self.recorder.record(
            RunCompleted(
                answer=answer, outputs={"module": module}, iterations=self.iterations,
                llm_calls=self.recorder.llm_calls,
            )
        )  # fmt: skip
        return Answered(answer, root_head_hash=head.hash)

    def _taken_over(self, adapter: Any, taken: Taken) -> Answered | Stopped | Failed:
        """Carry on a run whose holder died, from its record: `run.resumed` appended against
        the head read (the old holder's next append is refused), then the module the record
        was in goes on from where it stands (`chat.resume.crashed`)."""
        point = taken.point
        if point is None:  # the run had ended: its end stands, nothing runs again
            return self._from_record(taken)
        ctx = self.ctx
        self.recorder.record(
            RunResumed(
                attempt=ctx.attempt, replica=ctx.mesh.actor.replica,
                reused_calls=point.llm_calls, in_flight=point.what_repeats,
            )
        )  # fmt: skip
        with dspy.context(lm=self.lm(), adapter=adapter):
            answer, module = self._modules(point)
        self.boundary()
        return self._completed(answer, module)

    def _from_record(self, taken: Taken) -> Answered | Stopped | Failed:
        """How a run that ended before its holder died ended (its turn's end was not stored)."""
        end = taken.events[-1]
        if isinstance(end, RunCompleted):
            return Answered(end.answer, root_head_hash=taken.head.hash)
        if isinstance(end, RunCancelled):
            return Stopped(end.partial_answer)
        if isinstance(end, RunFailed) and end.reason == NOT_CONFIGURED:
            return Failed(
                f"the chat agent has no language model to answer with ({end.error})",
                code=NOT_CONFIGURED,
            )
        if isinstance(end, RunFailed) and end.reason in LLM_FAILURES:
            return Failed(end.error, code=end.reason, retryable=end.retryable)
        raise ChatFailed(f"the chat run failed: {getattr(end, 'error', type(end).__name__)}")

    def _modules(self, point: Crashed | None = None) -> tuple[str, str]:
        """The escalation loop: (answer, the module that gave it); from `point` for a run
        taken over from its record (no opening move: the record holds it)."""
        chars = escalation.context_chars(self.message, self.state.history, self.memory_text)
        move = escalation.opening(
            self.mode, chars, self.message, self.runner._options.context_threshold
        )
        module = "cot"
        fell_back = False
        trajectory = ""
        start: dict[str, Any] | None = None
        if point is not None and point.moved:
            move, module, fell_back = None, point.module, point.fell_back
            start = point.trajectory or None
            if module == "rlm" and point.escalated_from_react and start:
                trajectory = self._formatted(start)
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
                lower = escalation.fallback_from(module, self.mode)
                if lower is None or not _falls_back(exc):
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
                        error=_why(exc),
                    )
                )
                module = lower
                fell_back = True
                self.may_escalate = False


class RlmRouteFailed(RuntimeError):
    """The RLM route's run ended without an answer (its own record says why); `code` is a
    model call's kind when one ended it."""

    def __init__(self, message: str, code: str = "", retryable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.retryable = retryable


__all__ = ["ChatFailed", "ChatOptions", "ChatRunner", "chat_runner", "load_session"]
