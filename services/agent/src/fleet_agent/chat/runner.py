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

This module is the runner's shell on the run kernel (`fleet_agent.run`): the turn's scope
(tree, context, cancel), then `chat.turn_run.TurnRun` in dspy's thread; what a turn reads first
is `chat.loading`.
"""

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from fleet_agent.chat import escalation
from fleet_agent.chat.loading import load_crashed, load_resume, load_session, load_turn
from fleet_agent.chat.session_log import LogScope, append
from fleet_agent.chat.settings import ChatSettings
from fleet_agent.chat.tools import TurnState
from fleet_agent.chat.turn_context import in_sandbox
from fleet_agent.chat.turn_run import TurnRun
from fleet_agent.chat.urls import UrlLoader
from fleet_agent.engine.mesh import MeshPool
from fleet_agent.engine.model import EngineMesh, RlmResult, RlmTask, RunContext
from fleet_agent.engine.rlm import run_rlm
from fleet_agent.engine.runner import child_run_consumer, session_sandbox
from fleet_agent.engine.settings import EngineSettings
from fleet_agent.run.failures import NOT_CONFIGURED
from fleet_agent.run.scope import TreeLimits, turn_scope
from fleet_agent.run.seams import in_own_thread
from fleet_agent.runners import Answered, CancelToken, Failed, Parked, Stopped, TurnInput
from fleet_events.session import InputExpired
from fleet_mesh.secrets import SecretError, private_key_from_env
from fleet_mesh.service import ServiceContext

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
        state, request, context = await mesh.on_bus(load_turn(mesh, turn, threshold))
        mode = request.mode if request is not None else "auto"
        resume = None
        taken = None
        if turn.attempt > 1:  # a parked turn answered, or a dead holder's turn redelivered
            timeout = self._options.clarify_timeout_s
            resume = await mesh.on_bus(load_resume(mesh, turn, timeout))
            if resume is None:
                taken = await mesh.on_bus(load_crashed(mesh, turn))
        escalation.check_mode(mode)
        task = self._rlm_task
        steps = max(self._options.react_max_iters + 3, task.max_iters + 1)
        limits = TreeLimits.of(task, max_steps_per_run=steps)
        async with turn_scope(mesh, turn, token, limits) as scope:
            loop = asyncio.get_running_loop()
            message = turn.message + context
            chat = TurnRun(
                self, scope.ctx, state, mode, message, loop, resume, taken,
                context_in_sandbox=in_sandbox(request, context), asked=turn.message,
                attached=context,
            )  # fmt: skip
            try:
                outcome = await in_own_thread(chat.run)
            finally:
                scope.fenced = chat.recorder.fenced  # a fenced attempt's tree is the new holder's
                if self._on_turn_end is not None:
                    self._on_turn_end(chat.state)
            if isinstance(outcome, Parked):
                # the tree stays open for the resumed attempt; the question expires on time
                # even though no worker holds the turn (this replica's timer)
                scope.parked = True
                expiry = asyncio.ensure_future(self._expire(mesh, turn, outcome.request_id))
                self._timers.add(expiry)
                expiry.add_done_callback(self._timers.discard)
            return outcome

    async def _expire(self, mesh: EngineMesh, turn: TurnInput, request_id: str) -> None:
        timeout = self._options.clarify_timeout_s
        await asyncio.sleep(timeout)
        state, _ = await mesh.on_bus(load_session(mesh, turn))
        pending = state.pending_input
        if pending is None or pending.request_id != request_id:
            return  # answered (or ended) meanwhile
        scope = LogScope(turn.tenant, turn.session, turn.turn, pending.run or "")
        expired = InputExpired(request_id=request_id, reason=f"no answer in {timeout:g}s")
        await mesh.on_bus(append(mesh, scope, expired))


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


__all__ = ["NOT_CONFIGURED", "ChatOptions", "ChatRunner", "chat_runner", "load_session"]
